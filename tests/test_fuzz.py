"""Structure-aware fuzzing of every advertised API and version against a live gateway.

Bounded: 20,000 frames from a fixed seed (the boundary sweep of every field
of every seed, then random mutations: testkit/fuzz.py), eight connections at
once, while a canary produces with acks=-1 and reads back on its own
connection. One random frame in 20 is a login message before authentication
on the gateway's SASL listener (testkit/fuzz_sasl.py); a real login still
works at the end. ``python -m bench.fuzz`` runs the same for as long as asked.
"""

from __future__ import annotations

import asyncio

import pytest

from kafka_gateway.apis import APIS
from testkit.fuzz import boundaries, seeds
from testkit.fuzz_run import CANARY_EVERY, GATEWAY_FLAGS, SASL_SHARE, run
from testkit.fuzz_sasl import SASL_STAGES, login_works
from testkit.gateway import GatewayProcess

FRAMES = 20_000
SEED = 20_231_123
PEAK_RSS_MIB = 256  # the gateway's high-water mark over the whole run


@pytest.mark.timeout(240)
def test_fuzzing_leaves_the_gateway_serving_and_the_canary_whole(tmp_path):
    with GatewayProcess(tmp_path / "data", *GATEWAY_FLAGS) as gateway:
        totals = run(gateway, FRAMES, SEED)
        print(f"\nfuzz: {totals.line()}")
        print(f"SASL: {dict(sorted(totals.sasl.items()))}")
        assert gateway.process is not None and gateway.process.poll() is None
        assert asyncio.run(login_works(gateway))
    output = gateway.output()

    assert totals.crashes == 0
    assert totals.sent == FRAMES
    assert totals.sent == totals.answered + totals.closed + totals.unanswered
    assert totals.mismatched == 0  # every answer went to the request it answers
    assert totals.canary_failure is None
    assert totals.canary_lost == 0
    assert totals.canary_batches >= FRAMES // CANARY_EVERY // 4  # rounds coalesce under load
    # Malformed-but-decodable requests get error codes, never a traceback.
    assert totals.handler_errors == 0
    assert "Traceback" not in output
    assert totals.peak_rss_mib < PEAK_RSS_MIB
    answered = {key.rsplit(" ", 2)[0] for key, n in totals.by_api.items()
                if key.endswith(" answered") and n}
    assert answered == {api.name for api in APIS.values()}
    # Login messages before authentication: every stage reached, its valid setup
    # answered each time, and both answers and closes among the outcomes.
    assert totals.sasl_setup_failures == 0
    assert {key.split()[0] for key in totals.sasl} == set(SASL_STAGES)
    random_frames = FRAMES - len(boundaries(seeds()))
    assert sum(totals.sasl.values()) >= random_frames * SASL_SHARE / 2
    assert any(key.endswith(" answered") for key in totals.sasl)
    assert any(key.endswith(" closed") for key in totals.sasl)
