"""Serving on the GPU: the Llama trained in bf16 through the CLI generates with the endpoint's batched KV cache on the
device (rows joining and leaving one left-padded cache get transformers' own greedy tokens), and `trainbook serve`
of its export answers over HTTP from the GPU, concurrent requests sharing forwards over the cache."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpu_helpers import LLAMA, PROJECT, cli

PROMPTS = [list(b"def "), list(b"The return value of"), list(b"Return a new list")]
NEW = 16
JOINS = {0: 0, 3: 1, 5: 2}  # step -> the prompt that joins then: later rows are shorter and longer than the first


@pytest.fixture(scope="module")
def llama(gpu_runs):
    return gpu_runs(*LLAMA)


def test_the_kv_cache_generates_on_the_gpu_what_transformers_generates(llama, figure):
    """The decoder the endpoint generates with (toolkit.deploy.serving.kv_cache), over the trained model on the GPU:
    its cache stays on the device, and each row's greedy tokens are those of transformers' generate() on the same
    device for that prompt alone (logits within float rounding)."""
    import torch

    from toolkit.deploy.export import load_trained_model
    from toolkit.deploy.serving.kv_cache import CachedDecoder, supports_batched_cache

    model, _, _ = load_trained_model(llama.path)
    model = model.to("cuda").eval()
    model.generation_config.eos_token_id = None  # NEW tokens every time, as the decoder below makes
    model.generation_config.pad_token_id = 0
    assert supports_batched_cache(model)
    decoder = CachedDecoder(model)
    tokens: dict[int, list[int]] = {}
    logits: dict[int, list[torch.Tensor]] = {}
    on_device = set()
    for step in range(NEW + max(JOINS)):
        live = [row for row in decoder.members if len(tokens[row]) < NEW]
        decoder.retain(live)
        if live:
            for row, row_logits in zip(live, decoder.step([tokens[row][-1] for row in live])):
                tokens[row].append(int(row_logits.argmax()))
                logits[row].append(row_logits.float().cpu())
            on_device |= {t.device.type for t in decoder.keys + decoder.values + [decoder.mask]}
        if step in JOINS:
            row = JOINS[step]
            first = decoder.join(row, PROMPTS[row])
            tokens[row], logits[row] = [int(first.argmax())], [first.float().cpu()]
    assert on_device == {"cuda"}, on_device
    worst = 0.0
    for row, prompt in enumerate(PROMPTS):
        with torch.inference_mode():
            out = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=NEW, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True)
        expected = out.sequences[0, len(prompt):].tolist()
        assert tokens[row] == expected, (bytes(prompt), bytes(tokens[row]), bytes(expected))
        worst = max(worst, max(float((a - b.float().cpu()[0]).abs().max()) for a, b in zip(logits[row], out.logits)))
    figure("kv_cache_gpu_max_logit_diff", worst)
    assert worst < 1e-3, worst


def test_trainbook_serve_answers_from_the_gpu_with_its_kv_cache(llama, tmp_path, figure):
    """`trainbook export` then `trainbook serve` of the folder: the endpoint reports its model on cuda with the KV
    cache, answers with the key, gives the same greedy text twice, and batches concurrent generations over the cache
    (fewer forwards than tokens)."""
    missing = [m for m in ("onnx", "azureml_inference_server_http") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed here: `trainbook export` needs onnx, `trainbook serve` Azure "
                    "ML's inference server (the serve extra)")
    folder = tmp_path / "model"
    exported = cli("export", str(llama.path), "--out", str(folder))
    assert exported.returncode == 0, exported.stderr[-3000:]
    ws = tmp_path / "ws"
    proc = subprocess.Popen([sys.executable, "-m", "toolkit", "serve", str(folder), "--workspace", str(ws)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=PROJECT)
    try:
        first = proc.stdout.readline()  # printed once the endpoint answers
        assert ", torch, model " in first, first + (proc.stderr.read() if proc.poll() is not None else "")
        url = first.split(": ", 1)[1].split(" ")[0]
        listed = json.loads(cli("endpoints", "--workspace", str(ws), "--json").stdout)
        (endpoint,) = listed["endpoints"]
        key = open(endpoint["key_file"]).read().strip()

        def call(body: dict | None = None) -> dict:
            request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                             headers={"Authorization": f"Bearer {key}",
                                                      "Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as answer:
                return json.loads(answer.read())

        ready = call()
        assert (ready["runtime"], ready["kv_cache"], ready["device"]) == ("torch", True, "cuda:0"), ready
        greedy = {"prompt": "def ", "max_new_tokens": NEW, "temperature": 0}
        once = call(greedy)
        assert once["new_tokens"] == NEW and call(greedy)["text"] == once["text"], once
        before = call()
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda seed: call({"prompt": "def ", "max_new_tokens": NEW, "seed": seed}),
                                    range(12)))
        after = call()
        tokens = sum(a["new_tokens"] for a in answers)
        forwards = after["forwards"] - before["forwards"]
        figure("serve_gpu_forwards_per_token", round(forwards / tokens, 3))
        assert forwards < tokens / 2, f"{forwards} forwards for {tokens} tokens: not batched over the cache"
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
