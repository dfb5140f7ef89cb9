"""Rate and concurrency limits: their declarations and the token bucket's arithmetic.
The state they count lives in the database (the store); this wing only decides.
"""
