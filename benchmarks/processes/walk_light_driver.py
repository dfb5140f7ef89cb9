"""The polite walk's driver (``examples/walk_api_politely.py --drive``) with the
benchmark's light HTTP client (``tests.fake_api.LightClient``) in place of httpx:
the same job, the same rate limit, the same drive, less client CPU per request.
Run by ``python -m benchmarks external_walk --client light`` as
``python -m benchmarks.processes.walk_light_driver``; same options as the example."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from types import ModuleType

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from benchmarks.harness import REPO
from tests.fake_api import LightClient


def the_example() -> ModuleType:
    """``examples/walk_api_politely.py`` (a file, not in a package), loaded by its path."""
    path = REPO / "examples" / "walk_api_politely.py"
    spec = importlib.util.spec_from_file_location("walk_api_politely", path)
    assert spec is not None, path
    assert spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def main(argv: list[str]) -> int:
    walk = the_example()
    args = walk.parse(argv)
    engine = create_async_engine(args.url)
    client = LightClient(args.api, args.concurrency * args.loops)
    try:
        store = jobrun.SqlJobRunStore(engine)
        registry = walk.build_registry(
            client,  # the parts of httpx the job uses
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
