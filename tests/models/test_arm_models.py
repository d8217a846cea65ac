"""The smallest of Arm's model tests, DS-CNN, in `make test` (issue 27): it compiles
at W and at I through `codec-tosa compile`'s path into one delegate with nothing
computed on the CPU and validates PASS on held-out inputs. The others (the deep
autoencoder, ResNet-8, MobileNetV1-0.25, MobileNetV2/V3, DeiT-tiny, InceptionV3,
the LSTM), with stock beside them, are `benchmarks/arm_models.py` (`make peer`);
nested inputs are tests/api/test_nested.py and tests/tools/test_program_shapes.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from codec_tosa.runtime.pte import inspect_pte
from codec_tosa.spec import CodecSpec
from codec_tosa.tools.compiler import compile_module
from codec_tosa.validation.validate import Verdict, validate
from codec_tosa_examples.models import load_model

IO_KERNELS = {"quantized_decomposed::quantize_per_tensor", "quantized_decomposed::dequantize_per_tensor"}


@pytest.mark.parametrize("policy", ["W", "I"])
@pytest.mark.parametrize("name", ["ds_cnn"])
def test_arm_model_compiles_and_validates(name: str, policy: str, tmp_path: Path) -> None:
    model, example = load_model(name)
    result = compile_module(name, (model, example), CodecSpec(policy), tmp_path, progress=False, samples=4)
    info = inspect_pte(Path(result.pte).read_bytes())
    assert len(info.delegate_ids) == 1 and set(info.operators) <= IO_KERNELS, info
    v = validate(result.pte)
    assert v.verdict is Verdict.PASS, "\n".join(v.lines())
