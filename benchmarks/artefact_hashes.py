"""The sha256 of every artefact of a fixed set of compiles, to show that a change which
should not change behaviour changes no byte (issue 53's "behaviour unchanged").

Each model is compiled through `codec-tosa compile`'s own code (`compile_model`) for
every target and policy below, with a fixed number of held-out samples (the default
number depends on the clock); report.json is hashed with its timings taken out.

    python benchmarks/artefact_hashes.py --json before.json
    ... change the code ...
    python benchmarks/artefact_hashes.py --json after.json --against before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

MODELS = ("tiny_shufflenet", "resnet8", "digits_vit")
# (name, CodecSpec keywords)
FLOWS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("tosa-W", {"policy": "W"}),
    ("vgf-W", {"policy": "W", "target": "vgf"}),
    ("tosa-I", {"policy": "I"}),
    ("u55-I", {"policy": "I", "target": "ethos-u55-128"}),
    ("u85-I", {"policy": "I", "target": "ethos-u85-256"}),
    ("xnnpack-I", {"policy": "I", "target": "xnnpack"}),
    ("u85-auto", {"policy": "I", "target": "ethos-u85-256", "precision": "auto", "budget": 30.0}),
)
SAMPLES = 2


def _untimed(value: Any) -> Any:
    """report.json without what the clock decides (stage times, search seconds, budgets,
    and `priced_in_bytes`, which quotes the seconds a Vela lowering took)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items()
                if k not in ("times", "priced_in_bytes") and not k.endswith("_s") and "seconds" not in k}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def hashes(model: str, flow: str, options: dict[str, Any]) -> dict[str, str]:
    from codec_tosa.spec import CodecSpec
    from codec_tosa.tools.compiler import compile_model

    with tempfile.TemporaryDirectory() as out:
        try:
            compile_model(model, CodecSpec(**options), out, progress=False, samples=SAMPLES)
        except Exception as e:  # noqa: BLE001 (a refusal is a result too: it must stay the same)
            return {"refused": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        found = {}
        for path in sorted(Path(out).iterdir()):
            data = path.read_bytes()
            if path.name == "report.json":
                data = json.dumps(_untimed(json.loads(data)), sort_keys=True).encode()
            found[path.name] = hashlib.sha256(data).hexdigest()
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="write the hashes here")
    parser.add_argument("--against", help="an earlier run's JSON: print every artefact that differs")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--flows", default=",".join(name for name, _ in FLOWS))
    args = parser.parse_args()
    from codec_tosa.tools import model_libs

    model_libs.prepare()
    wanted = args.flows.split(",")
    result: dict[str, dict[str, str]] = {}
    for model in args.models.split(","):
        for flow, options in FLOWS:
            if flow in wanted:
                result[f"{model} {flow}"] = hashes(model, flow, options)
                print(f"{model:16s} {flow:10s} " + " ".join(f"{k}={v[:12]}" for k, v in result[f'{model} {flow}'].items()),
                      flush=True)
    Path(args.json).write_text(json.dumps(result, indent=1, sort_keys=True))
    if not args.against:
        return 0
    before = json.loads(Path(args.against).read_text())
    differ = [f"{key}: {name}" for key in sorted(set(before) | set(result))
              for name in sorted(set(before.get(key, {})) | set(result.get(key, {})))
              if before.get(key, {}).get(name) != result.get(key, {}).get(name)]
    print("\n".join(differ) if differ else f"all {sum(map(len, result.values()))} artefacts byte-identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
