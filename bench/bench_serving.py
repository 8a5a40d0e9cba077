"""The local online endpoint: latency, throughput by concurrency, ONNX Runtime vs eager torch, the HTTP
server's overhead, and batched vs unbatched throughput.

    python bench/bench_serving.py [--rounds 3] [--tokens 32]

The model has the demo config's shape (4 layers x 96, context 128), trained for a few steps: speed does not
depend on what the weights learned. Every endpoint is started once; the measurements interleave them round by
round (A B A B ...), and ratios are medians of per-round ratios with their range, as this machine is noisy.

1. single requests, one at a time: client latency p50 / p95 / p99, per runtime
2. requests/s at 1, 4 and 16 concurrent clients, per runtime
3. the server's overhead: HTTP p50 minus an in-process call of the same service p50 (target < 5 ms)
4. 16 clients, batched (max_batch 16) vs unbatched (max_batch 1) requests/s (target >= 2x)
4b. OpenAI's route against Azure ML's: p50 of POST /v1/completions minus p50 of POST /score, the same generation on
   one endpoint, in turns
5. a transformers Llama (KV_MODEL, trained a few steps through the CLI and exported): generated tokens/s with the
   KV cache vs recomputing the context for every token, a 74-token prompt (KV_PROMPT) and 128 new tokens, one
   request at a time and 8 at once (target >= 3x), through the batcher that serves them (in-process: HTTP adds the
   same few ms to both sides)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import figures  # noqa: E402
from toolkit.deploy.export import export_run  # noqa: E402
from toolkit.deploy.serving.endpoint import serve  # noqa: E402
from toolkit.deploy.serving.load_test import Client, latencies_s, percentile_ms, request_body, throughput  # noqa: E402
from toolkit.deploy.serving.options import ServingOptions  # noqa: E402
from toolkit.deploy.serving.service import ScoringService  # noqa: E402

PROJECT = Path(__file__).resolve().parent.parent
CLIENTS = (1, 4, 16)


def train_and_export(tmp: Path) -> Path:
    run = tmp / "run"
    subprocess.run([sys.executable, "-m", "toolkit", "train", "demo", "--run-dir", str(run), "--set",
                    "train.max_steps=5", "--set", "train.max_seconds=0", "--set", "profile.enabled=false",
                    "--set", "train.eval_every=5", "--set", "train.eval_batches=1"], check=True, cwd=PROJECT,
                   capture_output=True)
    return export_run(run).path


def body(tokens: int) -> Callable[[int], bytes]:
    return lambda seed: request_body("def ", tokens, seed, temperature=0.8, top_k=40)


def latencies(call, n: int, tokens: int) -> list[float]:
    return latencies_s(call, n, body(tokens))


def ratio_summary(pairs: list[tuple[float, float]]) -> str:
    ratios = [a / b for a, b in pairs]
    return f"median {statistics.median(ratios):.2f} (range {min(ratios):.2f} to {max(ratios):.2f})"


# hidden 256 x 4 layers (~3M parameters): big enough that a forward's arithmetic, not transformers' per-call overhead
# (a few ms on this CPU), is what the cache saves; context 256 holds the prompt and 128 new tokens
KV_MODEL = ("{hidden_size: 256, intermediate_size: 688, num_hidden_layers: 4, num_attention_heads: 4, "
            "num_key_value_heads: 4, vocab_size: 256, max_position_embeddings: 256, tie_word_embeddings: true}")
KV_LABEL = "Llama, 4 layers x 256, context 256"
KV_NEW_TOKENS = 128
# a line of code and its docstring, as a code model is prompted (74 bytes, so 74 tokens); "def " alone would make the
# context, and so what recomputing it costs, unrealistically short
KV_PROMPT = b'def read_config(path):\n    """Return the settings in the file at path."""\n'

KV_CONCURRENT = (1, 8)
KV_REPEATS = 2  # generations per side per round


def train_and_export_llama(tmp: Path) -> Path:
    run = tmp / "llama-run"
    subprocess.run([sys.executable, "-m", "toolkit", "train", "llama", "--run-dir", str(run), "--set",
                    f"model.hf.config={KV_MODEL}", "--set", "train.max_steps=3", "--set", "train.max_seconds=0",
                    "--set", "profile.enabled=false", "--set", "train.eval_every=3", "--set", "train.eval_batches=1"],
                   check=True, cwd=PROJECT, capture_output=True)
    return export_run(run).path


def kv_cache_bench(tmp: Path, rounds: int) -> None:
    """Generated tokens/s with and without the KV cache, interleaved round by round; printed as a table."""
    from toolkit.deploy.serving.batcher import Batcher
    from toolkit.deploy.serving.protocol import GenerateRequest
    from toolkit.deploy.serving.runtimes import load_runtime

    model = train_and_export_llama(tmp)
    torch_runtime = load_runtime(model, "torch")
    # the KV cache and recomputing the context on the same eager model; ONNX Runtime (which recomputes) beside them
    sides = {"cache": Batcher(torch_runtime, max_batch=16, max_wait_ms=0, kv_cache=True),
             "no cache": Batcher(torch_runtime, max_batch=16, max_wait_ms=0, kv_cache=False),
             "onnx": Batcher(load_runtime(model, "onnx"), max_batch=16, max_wait_ms=0)}

    def generate(side: str, at_once: int, seed: int) -> tuple[int, float]:
        """(tokens generated, seconds) for ``at_once`` requests submitted together."""
        started = time.perf_counter()
        futures = [sides[side].submit(GenerateRequest(KV_PROMPT, KV_NEW_TOKENS, 0.8, 40, seed + i))
                   for i in range(at_once)]
        return sum(f.result(timeout=600)["new_tokens"] for f in futures), time.perf_counter() - started

    for side in sides:  # warm up: the first forwards pay for allocations and thread pools
        generate(side, 1, 10**6)
    speed = {(side, n): [] for side in sides for n in KV_CONCURRENT}  # tokens/s, one figure per round
    for r in range(rounds):
        for n in KV_CONCURRENT:
            done = {side: [0, 0.0] for side in sides}
            for rep in range(KV_REPEATS):  # A B C A B C within the round too: this machine's load moves in seconds
                for side in sides:  # the same seeds, so the same tokens, on every side
                    tokens, seconds = generate(side, n, 1000 * (r * KV_REPEATS + rep))
                    done[side][0] += tokens
                    done[side][1] += seconds
            for side, (tokens, seconds) in done.items():
                speed[side, n].append(tokens / seconds)
        print(f"kv cache round {r + 1}/{rounds} done", flush=True)
    print(f"\ngeneration, transformers {KV_LABEL}, a {len(KV_PROMPT)}-token prompt and {KV_NEW_TOKENS} new tokens per "
          f"request, {rounds} rounds")
    print(f"{'requests at once':<17} {'torch + KV cache':>17} {'torch, no cache':>16} {'ONNX Runtime':>13}   "
          "KV cache / no cache (tokens/s)")
    for n in KV_CONCURRENT:
        pairs = list(zip(speed["cache", n], speed["no cache", n]))
        print(f"{n:<17} " + " ".join(f"{statistics.median(speed[side, n]):>{w}.1f}"
                                     for side, w in zip(sides, (17, 16, 13))) + f"   {ratio_summary(pairs)}")
        figures.record(__file__, f"kv_cache_{n}", area="serving", figure=f"generation with the KV cache, {n} at once",
                       compared=f"tokens/s with / without the KV cache, {KV_LABEL}, {KV_NEW_TOKENS} new tokens",
                       values=[a / b for a, b in pairs], target=(">=", 3.0))
    print(f"target: KV cache >= 3x at {KV_NEW_TOKENS} new tokens")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per request")
    parser.add_argument("--singles", type=int, default=40, help="sequential requests per round for latency")
    parser.add_argument("--kv-only", action="store_true", help="only the KV cache comparison (part 5)")
    args = parser.parse_args()
    if args.kv_only:
        with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
            kv_cache_bench(Path(tmp), args.rounds)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        tmp = Path(tmp)
        model = train_and_export(tmp)
        endpoints = {
            ("onnx", 16): serve(model, runtime="onnx", max_batch=16, name="onnx-b16", workspace=tmp / "ws"),
            ("torch", 16): serve(model, runtime="torch", max_batch=16, name="torch-b16", workspace=tmp / "ws"),
            ("onnx", 1): serve(model, runtime="onnx", max_batch=1, name="onnx-b1", workspace=tmp / "ws"),
        }
        direct = ScoringService(model, ServingOptions(runtime="onnx", max_batch=16, max_wait_ms=5))

        def direct_call(data: bytes) -> float:
            t0 = time.perf_counter()
            status, _ = direct.handle("POST", None, len(data), lambda n: data[:n])
            assert status == 200
            return time.perf_counter() - t0

        try:
            callers = {key: Client(ep) for key, ep in endpoints.items()}
            for call in callers.values():  # warm up: first requests pay for lazy initialisation
                latencies(call, 3, args.tokens)
            latencies(direct_call, 3, args.tokens)
            single = {k: [] for k in ("onnx", "torch", "direct")}
            rps = {(rt, c): [] for rt in ("onnx", "torch") for c in CLIENTS}
            batched_pairs, overhead, openai_overhead = [], [], []
            for r in range(args.rounds):
                # fresh connections each round: the server closes idle kept-alive ones after 2 s (gunicorn's default)
                callers = {key: Client(ep) for key, ep in endpoints.items()}
                http = latencies(callers["onnx", 16], args.singles, args.tokens)
                inproc = latencies(direct_call, args.singles, args.tokens)
                single["onnx"] += http
                single["direct"] += inproc
                overhead.append(1000 * (statistics.median(http) - statistics.median(inproc)))
                single["torch"] += latencies(callers["torch", 16], args.singles, args.tokens)
                # the same generation through OpenAI's route and Azure ML's, in turns on one endpoint
                routes = {"score": Client(endpoints["onnx", 16]),
                          "openai": Client(endpoints["onnx", 16], path="/v1/completions")}
                bodies = {"score": lambda seed: request_body("def ", args.tokens, seed, temperature=0.8, top_k=0),
                          "openai": lambda seed: json.dumps({"model": "m", "prompt": "def ", "max_tokens": args.tokens,
                                                             "temperature": 0.8, "seed": seed}).encode()}
                p50 = {name: [] for name in routes}
                for turn in range(4):
                    for name in (("score", "openai") if turn % 2 == 0 else ("openai", "score")):
                        p50[name] += latencies_s(routes[name], args.singles // 4, bodies[name])
                openai_overhead.append(1000 * (statistics.median(p50["openai"]) - statistics.median(p50["score"])))
                for clients in CLIENTS:
                    for rt in ("onnx", "torch"):
                        rps[rt, clients].append(throughput(endpoints[rt, 16], clients, 4, body(args.tokens)))
                unbatched = throughput(endpoints["onnx", 1], 16, 4, body(args.tokens))
                batched_pairs.append((rps["onnx", 16][-1], unbatched))
                print(f"round {r + 1}/{args.rounds} done", flush=True)
        finally:
            for ep in endpoints.values():
                ep.stop()

    print(f"\nlocal endpoint, demo-shaped model, {args.tokens} new tokens per request, {args.rounds} rounds")
    print(f"\n{'single requests':<22} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}")
    for name, label in (("onnx", "HTTP, ONNX Runtime"), ("torch", "HTTP, eager torch"),
                        ("direct", "in-process, ONNX")):
        values = single[name]
        print(f"{label:<22} {percentile_ms(values, 50):>8.1f} {percentile_ms(values, 95):>8.1f} {percentile_ms(values, 99):>8.1f}")
    print(f"\n{'requests/s':<22} " + " ".join(f"{f'{c} client' + ('s' if c > 1 else ''):>11}" for c in CLIENTS))
    for rt, label in (("onnx", "ONNX Runtime"), ("torch", "eager torch")):
        print(f"{label:<22} " + " ".join(f"{statistics.median(rps[rt, c]):>11.1f}" for c in CLIENTS))
    onnx_vs_torch = [(o, t) for o, t in zip(rps["onnx", 16], rps["torch", 16])]
    print(f"ONNX Runtime / eager torch at 16 clients: {ratio_summary(onnx_vs_torch)}")
    figures.record(__file__, "onnx_vs_torch", area="serving", figure="requests/s at 16 clients, by runtime",
                   compared="ONNX Runtime / eager torch", values=[o / t for o, t in onnx_vs_torch])
    print(f"\nserver overhead at p50 (HTTP - in-process, same service): median {statistics.median(overhead):.2f} ms "
          f"(range {min(overhead):.2f} to {max(overhead):.2f}); target < 5 ms")
    print(f"batched / unbatched requests/s at 16 clients (ONNX): {ratio_summary(batched_pairs)}; target >= 2")
    figures.record(__file__, "overhead", area="serving", figure="the HTTP server's overhead at p50",
                   compared="HTTP p50 - in-process p50, same service", values=overhead, target=("<", 5.0), unit="ms")
    print(f"OpenAI's route over Azure ML's at p50 (/v1/completions - /score, the same generation): median "
          f"{statistics.median(openai_overhead):.2f} ms (range {min(openai_overhead):.2f} to {max(openai_overhead):.2f})")
    figures.record(__file__, "openai_overhead", area="serving", figure="OpenAI's route against /score at p50",
                   compared="p50 of POST /v1/completions - p50 of POST /score, the same generation, ONNX",
                   values=openai_overhead, unit="ms")
    figures.record(__file__, "batching", area="serving", figure="batching at 16 clients",
                   compared="requests/s batched (max_batch 16) / unbatched, ONNX",
                   values=[b / u for b, u in batched_pairs], target=(">=", 2.0))
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        kv_cache_bench(Path(tmp), args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
