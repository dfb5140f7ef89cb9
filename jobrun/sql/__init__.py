"""The SQLAlchemy Core adapter: one store for SQLite and Postgres."""
