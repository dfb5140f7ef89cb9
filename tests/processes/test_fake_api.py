"""The stand-in external API refuses what its bucket cannot serve and honours idempotency keys."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.fake_api import FakeApi, LightClient, object_size, serve


async def test_the_fake_api_refuses_above_its_bucket_with_retry_after() -> None:
    # A rate too slow to refill during the test: exactly the bucket's depth is served.
    api = FakeApi(per_second=0.01, burst=4, latency_ms=0)
    async with await serve(api) as serving, httpx.AsyncClient(base_url=serving.url) as client:
        answers = await asyncio.gather(*(client.get(f"/objects/{n}") for n in range(10)))
        stats = (await client.get("/stats")).json()
    statuses = [answer.status_code for answer in answers]
    assert statuses.count(200) == 4  # burst 4 + 0.1 s of the rate: 4.001 tokens, the next in 100 s
    assert statuses.count(429) == 6
    refused = next(answer for answer in answers if answer.status_code == 429)
    assert int(refused.headers["retry-after"]) >= 1
    served = next(answer for answer in answers if answer.status_code == 200)
    assert served.json()["size"] == object_size(served.json()["id"])
    assert (stats["served"], stats["refused"]) == (4, 6)


async def test_the_fake_api_writes_once_per_idempotency_key() -> None:
    api = FakeApi(latency_ms=0)
    async with await serve(api) as serving, httpx.AsyncClient(base_url=serving.url) as client:
        for key in ("a", "a", "b"):
            answer = await client.post("/objects/7/mark", headers={"Idempotency-Key": key})
            assert answer.status_code == 200
        await client.post("/objects/8/mark")
        await client.post("/objects/8/mark")
        stats = (await client.get("/stats")).json()
    assert stats["writes"] == {"7": 2, "8": 2}


async def test_the_light_client_reads_what_the_walk_reads() -> None:
    api = FakeApi(per_second=0.01, burst=1, latency_ms=0)
    async with await serve(api) as serving:
        client = LightClient(serving.url, 2)
        try:
            served = await client.request("GET", "/objects/3")
            refused = await client.request("POST", "/objects/3/mark", {"Idempotency-Key": "k"})
        finally:
            await client.aclose()
    assert (served.status_code, served.json()) == (200, {"id": 3, "size": object_size(3)})
    served.raise_for_status()
    assert refused.status_code == 429
    assert int(refused.headers.get("Retry-After")) >= 1
    with pytest.raises(RuntimeError, match="HTTP 429"):
        refused.raise_for_status()
