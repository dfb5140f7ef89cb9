"""The polite walk's driver (``examples/walk_api_politely.py --drive``) with the
benchmark's light HTTP client (``tests.fake_api.LightClient``) in place of httpx:
the same job, the same rate limit, the same drive, less client CPU per request.
Run by ``bench_external_walk.py --client light``; same options as the example."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import walk_api_politely as walk

from tests.fake_api import LightClient


async def main(argv: list[str]) -> int:
    args = walk.parse(argv)
    engine = create_async_engine(args.url)
    client = LightClient(args.api, args.concurrency * args.loops)
    try:
        store = jobrun.SqlJobRunStore(engine)
        registry = walk.build_registry(
            client,  # type: ignore[arg-type]  (the parts of httpx the job uses)
            per_second=args.per_second,
            burst=args.burst,
            concurrency=args.concurrency,
        )
        await walk.drive(store, registry, args.loops)
    finally:
        await client.aclose()
        await engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
