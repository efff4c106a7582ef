#!/usr/bin/env python3
# Writes serving-fixture.json: a made-up but realistic result of
# `phaselab-cli bench --serving --json` (docs/serving.md's contract) for the
# Serving lab's tests and screenshots. Gemma 3 270M on 2 CPU threads, 4 chat
# streams (two 128-token answers each) and one 2000-token prompt arriving at
# 2 s, under a baseline, prefill-first, chunked:256 and disaggregated:1+1.
# The figures follow the measurements (a prefill of about 2.3 s, a
# median gap of about 32 ms); the summaries are computed from the timelines.
import json, math, random

STREAMS, CHAT_PROMPT, CHAT_ANSWER, LONG_PROMPT, LONG_ANSWER = 4, 32, 128, 2000, 16
LONG_AT, TTFT_T, ITL_T = 2000.0, 5000.0, 250.0
KV_BYTES_PER_TOKEN = 18 * 2 * 256 * 2  # layers x (K, V) x head dim x f16

def pct(xs, p):
    xs = sorted(xs)
    if not xs: return 0.0
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

def stats(xs):
    if not xs: return {"n": 0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0, "mean": 0.0}
    r = lambda v: round(v, 2)
    return {"n": len(xs), "p50": r(pct(xs, 50)), "p90": r(pct(xs, 90)), "p99": r(pct(xs, 99)),
            "max": r(max(xs)), "mean": r(sum(xs) / len(xs))}

def run(policy, label, with_long, itl, stall, rng):
    """stall(t) -> (pause_ms, note): extra wait of a chat token at time t."""
    timeline = []
    long_first = None
    if with_long:
        ttft = {"prefill-first": 2345.0, "chunked:256": 2610.0, "disaggregated:1+1": 4630.0}[policy]
        first = LONG_AT + ttft
        toks = [first]
        for _ in range(LONG_ANSWER - 1): toks.append(toks[-1] + itl * rng.uniform(0.9, 1.15))
        long_first = first
        timeline.append({"stream": 0, "kind": "long", "arrive_ms": LONG_AT, "n_prompt": LONG_PROMPT,
                         "first_token_ms": round(first, 2), "token_ms": [round(t, 2) for t in toks], "ok": True})
    for s in range(STREAMS):
        t = s * 12.0
        for _ in range(2):
            arrive = t
            first = arrive + 55 + rng.uniform(0, 20)
            toks = [first]
            for _ in range(CHAT_ANSWER - 1):
                nxt = toks[-1] + itl * rng.uniform(0.85, 1.2)
                if with_long: nxt += stall(toks[-1], nxt)
                toks.append(nxt)
            timeline.append({"stream": s, "kind": "chat", "arrive_ms": round(arrive, 2), "n_prompt": CHAT_PROMPT,
                             "first_token_ms": round(first, 2), "token_ms": [round(x, 2) for x in toks], "ok": True})
            t = toks[-1] + 2
    timeline.sort(key=lambda e: e["arrive_ms"])
    gaps, ttfts, tpots, good = [], [], [], 0
    for e in timeline:
        tk = e["token_ms"]
        g = [b - a for a, b in zip(tk, tk[1:])]
        if e["kind"] == "chat": gaps += g
        ttft = tk[0] - e["arrive_ms"]
        ttfts.append(ttft)
        tpots.append((tk[-1] - tk[0]) / (len(tk) - 1))
        if ttft <= TTFT_T and all(x <= ITL_T for x in g): good += 1
    end = max(e["token_ms"][-1] for e in timeline)
    tokens = sum(len(e["token_ms"]) for e in timeline)
    disagg = policy.startswith("disaggregated") and with_long
    row = {"policy": policy, "label": label, "target": "in-process",
           "placement": "prefill: core 0 · decode: core 1" if policy.startswith("disaggregated") else "",
           "requests": len(timeline), "ok": len(timeline), "duration_s": round(end / 1000, 3), "tokens": tokens,
           "tokens_per_s": round(tokens / (end / 1000), 2),
           "ttft_ms": stats(ttfts),
           "ttft_long_ms": stats([e["token_ms"][0] - e["arrive_ms"] for e in timeline if e["kind"] == "long"]),
           "itl_ms": stats(gaps), "tpot_ms": stats(tpots), "max_stall_ms": round(max(gaps), 2),
           "goodput_rps": round(good / (end / 1000), 3), "goodput_fraction": round(good / len(timeline), 3),
           "kv_transfers": 1 if disagg else 0, "kv_transfer_bytes": LONG_PROMPT * KV_BYTES_PER_TOKEN if disagg else 0,
           "kv_transfer_ms": 3.7 if disagg else 0.0, "timeline": timeline}
    return row

def main():
    rng = random.Random(1)
    prefill = (LONG_AT + 8, LONG_AT + 2345.0)
    def prefill_first(a, b):  # a token due inside the prefill waits for its end
        return prefill[1] - b + 20 if prefill[0] <= b <= prefill[1] else 0.0
    def chunked(a, b):  # each pass carries a 256-token chunk: about 65 ms more
        return rng.uniform(55, 72) if LONG_AT <= b <= LONG_AT + 2610.0 else 0.0
    rows = [run("chunked:256", "baseline (no long prompt)", False, 32.0, None, rng),
            run("prefill-first", "prefill-first", True, 32.0, prefill_first, rng),
            run("chunked:256", "chunked:256", True, 32.0, chunked, rng),
            run("disaggregated:1+1", "disaggregated:1+1", True, 44.0, lambda a, b: 0.0, rng)]
    out = {"model": "gemma-3-270m-q4_k_m.gguf", "backend": "cpu (avx2)", "threads": 2,
           "workload": {"streams": STREAMS, "chat_prompt": CHAT_PROMPT, "chat_answer": CHAT_ANSWER,
                        "long_prompt": LONG_PROMPT, "long_answer": LONG_ANSWER, "long_count": 1, "long_rate": 0.0,
                        "long_start_s": LONG_AT / 1000, "duration_s": 0.0, "seed": 1, "baseline": True},
           "targets": {"ttft_ms": TTFT_T, "itl_ms": ITL_T}, "rows": rows}
    with open(__file__.replace("make-serving-fixture.py", "serving-fixture.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")

main()
