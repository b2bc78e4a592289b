"""How long checking a model takes against checking its attention layer alone, as a user types
each (issue 54's target: a model within 2x its layer).

    python benchmarks/model_vs_layer.py [--rounds 1] [--only Llama,BERT] [--json PATH]

For each pair, ``attention-conformance check transformers:ModelClass`` (the smallest model of the
architecture built from its config, each kind of attention layer driven through it) and
``attention-conformance check tests/fixtures/library_transformers.py::Wrapper`` (the same
library's attention class wrapped as a user wraps it to check it alone, the mask and positions
built with the library's own utilities) run in a fresh interpreter, isolated in a worker as by
default. A model holds several kinds of layer (Whisper: encoder self, decoder self, cross), each
checked: the ratio is the model's time per kind over its layer's time. Prints each pair's wall
times, the ratio, and the median ratio; timings on a shared machine are noise, so run it on an
idle one and compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = "tests/fixtures/library_transformers.py"

PAIRS = {
    "Llama": ("LlamaForCausalLM", 1, "LlamaSelfAttention"),
    "Mistral": ("MistralForCausalLM", 1, "MistralSlidingWindowAttention"),
    "Qwen2": ("Qwen2ForCausalLM", 1, "Qwen2SdpaAttention"),
    "BERT": ("BertModel", 1, "BertEncoderSelfAttention"),
    "Whisper": ("WhisperForConditionalGeneration", 3, "WhisperDecoderSelfAttention"),
}
"""Name: (the model class, the kinds of attention layer it holds, its layer's wrapper)."""


def timed(spec: str) -> tuple[float, int]:
    """Wall seconds and exit code of one check of ``spec`` in a fresh interpreter."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "conformance", "check", spec], cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", default=",".join(PAIRS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for name in args.only.split(","):
        model, kinds, wrapper = PAIRS[name]
        model_times, layer_times, codes = [], [], set()
        for _ in range(args.rounds):  # alternated, so that a load change hits both alike
            seconds, code = timed(f"transformers:{model}")
            model_times.append(seconds)
            codes.add(code)
            seconds, code = timed(f"{LAYERS}::{wrapper}")
            layer_times.append(seconds)
            codes.add(code)
        whole, alone = statistics.median(model_times), statistics.median(layer_times)
        ratio = whole / kinds / alone
        rows.append({"name": name, "model": model, "kinds": kinds, "layer": wrapper,
                     "model_s": round(whole, 1), "layer_s": round(alone, 1),
                     "ratio_per_kind": round(ratio, 2), "exit_codes": sorted(codes)})
        print(f"{name:8} model {whole:6.1f} s ({kinds} kind(s))  layer {alone:6.1f} s  "
              f"per kind / layer {ratio:4.2f}x  exit {sorted(codes)}", flush=True)
    median = statistics.median(row["ratio_per_kind"] for row in rows)
    print(f"median per kind / layer: {median:.2f}x (target: at most 2x)")
    if args.json:
        args.json.write_text(json.dumps({"pairs": rows, "median_ratio": median}, indent=2) + "\n")


if __name__ == "__main__":
    main()
