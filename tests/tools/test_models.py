"""Model builders: shapes, parameter counts, seeding, and the model-spec loader."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from codec_tosa_examples.models import BUILTIN_MODELS, PAPER_MODELS, load_model


def _param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_registry_holds_the_paper_models_and_the_demo() -> None:
    assert set(BUILTIN_MODELS) == {
        "tiny_shufflenet", "shufflenet_v2", "unet", "siglip", "smollm2", "smollm2_decode", "inception_v3",
        "mobilenet_v2",
        "vit_tiny", "unet_256", "digits_resnet8", "digits_ds_cnn", "digits_mobilenet", "digits_vit",
        "ds_cnn", "mobilenet_v1_025", "resnet8", "deep_autoencoder", "deep_autoencoder_bn",
    }
    assert PAPER_MODELS == ("shufflenet_v2", "unet", "siglip", "smollm2")


def test_tiny_shufflenet_is_small_seeded_and_exports() -> None:
    model, inputs = load_model("tiny_shufflenet")
    assert not model.training
    assert [tuple(x.shape) for x in inputs] == [(1, 3, 32, 32)]
    assert _param_count(model) == 1378
    again, _ = load_model("tiny_shufflenet")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))

    ep = torch.export.export(model, inputs).run_decompositions()
    targets = {n.target for n in ep.graph.nodes if n.op == "call_function"}
    aten = torch.ops.aten
    # The structures the placement algorithm is about, all in one small graph.
    for needed in (aten.split_with_sizes.default, aten.cat.default, aten.view.default,
                   aten.permute.default, aten.clone.default, aten.max_pool2d_with_indices.default,
                   aten.convolution.default, aten._native_batch_norm_legit_no_training.default,
                   aten.relu.default, aten.addmm.default):
        assert needed in targets, needed
    with torch.no_grad():
        out = ep.module()(*inputs)
        assert tuple(out.shape) == (1, 10)
        assert torch.equal(out, model(*inputs))


def test_smollm2_decode_is_one_seeded_idempotent_step_over_a_prefilled_cache() -> None:
    from codec_tosa_examples.models import smollm2_decode

    model, (tokens, options) = smollm2_decode(num_layers=1)
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert tokens.shape == (1, 1) and tokens.dtype == torch.long
    assert set(options) == {"input_pos"} and options["input_pos"].tolist() == [5]
    k_cache = model.layers[0].attention.kv_cache.k_cache
    assert k_cache.shape == (1, 3, 128, 64)
    # the prompt filled positions 0..4, nothing beyond
    assert bool((k_cache[:, :, :5] != 0).any(dim=-1).all()) and not bool(k_cache[:, :, 5:].any())
    assert torch.equal(model.output.weight, model.tok_embeddings.weight)
    again, _ = smollm2_decode(num_layers=1)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    with torch.no_grad():
        first = model(tokens, options)
        assert first.shape == (1, 49152)
        assert torch.equal(model(tokens, options), first)  # writes its own position again

    ep = torch.export.export(model, (tokens, options)).run_decompositions()
    assert sorted(ep.graph_signature.buffers_to_mutate.values()) == [
        "layers.0.attention.kv_cache.k_cache", "layers.0.attention.kv_cache.v_cache"]


def test_building_does_not_disturb_the_callers_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_model("tiny_shufflenet")
    assert torch.equal(torch.rand(3), expected)


def test_load_model_from_a_file(tmp_path: Path) -> None:
    source = tmp_path / "mine.py"
    source.write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Linear(4, 2).train(), (torch.zeros(1, 4),)\n"
        "def wrong():\n"
        "    return torch.nn.Linear(4, 2)\n"
    )
    model, inputs = load_model(f"{source}:build")
    assert isinstance(model, torch.nn.Linear) and not model.training
    assert tuple(inputs[0].shape) == (1, 4)
    with pytest.raises(ValueError, match="wrong.*must return"):
        load_model(f"{source}:wrong")
    with pytest.raises(ValueError, match="has no function 'missing'"):
        load_model(f"{source}:missing")


def test_load_model_errors_name_the_spec(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model 'resnet9000'.*tiny_shufflenet"):
        load_model("resnet9000")
    missing = tmp_path / "nope.py"
    with pytest.raises(ValueError, match="nope.py.*does not exist"):
        load_model(f"{missing}:build")


# name -> (input shapes, output shape, parameter count); the counts are those
# of the published architectures (torchvision, smp, SmolVLM2-256M towers).
_EXPECTED = {
    "shufflenet_v2": ([(1, 3, 224, 224)], (1, 1000), 2_278_604),
    "inception_v3": ([(1, 3, 299, 299)], (1, 1000), 23_834_568),
    "mobilenet_v2": ([(1, 3, 224, 224)], (1, 1000), 3_504_872),
    "unet": ([(1, 3, 512, 512)], (1, 1, 512, 512), 24_436_369),
    "unet_256": ([(1, 3, 256, 256)], (1, 1, 256, 256), 24_436_369),
    "siglip": ([(1, 3, 512, 512)], (1, 1024, 768), 86_433_024),
    "smollm2": ([(1, 128, 576)], (1, 128, 576), 106_203_456),
    "vit_tiny": ([(1, 3, 32, 32)], (1, 17, 64), 80_576),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_EXPECTED))
def test_big_model_shapes_and_parameter_counts(name: str) -> None:
    shapes, out_shape, params = _EXPECTED[name]
    model, inputs = load_model(name)
    assert not model.training
    assert [tuple(x.shape) for x in inputs] == shapes
    assert _param_count(model) == params
    with torch.no_grad():
        assert tuple(model(*inputs).shape) == out_shape


@pytest.mark.slow
def test_unet_256_is_the_unet_with_its_weights_at_a_smaller_input_and_exports() -> None:
    big, _ = load_model("unet")
    small, inputs = load_model("unet_256")
    assert all(torch.equal(a, b) for a, b in zip(big.state_dict().values(), small.state_dict().values()))
    held_out = (torch.randn(1, 3, 256, 256, generator=torch.Generator().manual_seed(1234)),)
    with torch.no_grad():
        expected = big(*held_out)
        assert torch.equal(small(*held_out), expected)
        exported = torch.export.export(small, inputs).module()(*held_out)
    assert tuple(exported.shape) == (1, 1, 256, 256)
    assert torch.allclose(exported, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))


def test_model_libs_shim_is_idempotent_and_makes_torchvision_importable() -> None:
    from codec_tosa.tools import model_libs

    model_libs.prepare()
    model_libs.prepare()  # a second call must not redefine the schemas
    tv = model_libs.import_torchvision()
    assert tv.__version__.startswith("0.28.0")
    schema = str(torch.ops.torchvision.nms.default._schema)
    assert schema == "torchvision::nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"


def test_reestimated_batch_norms_normalise_held_out_batches() -> None:
    from codec_tosa_examples.models.batch_norm import reestimate_batch_norms

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(6):
        layers += [torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)]
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1, bias=False), *layers).eval()
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.weight.data.mul_(0.2)  # shrinks activations layer by layer under default statistics
    held_out = torch.randn(16, 3, 12, 12, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        before = model(held_out)
    assert before.std() < 0.01

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    assert reestimate_batch_norms(model, (torch.zeros(1, 3, 12, 12),)) == 6
    assert torch.equal(torch.rand(3), expected)
    assert not any(m.training for m in model.modules())
    with torch.no_grad():
        after = model(held_out)
    # each channel of the last batch norm close to zero mean, unit variance on unseen inputs
    assert after.mean(dim=(0, 2, 3)).abs().max() < 0.2
    assert ((after.var(dim=(0, 2, 3)) - 1).abs().max()) < 0.3
    assert reestimate_batch_norms(torch.nn.Linear(2, 2), (torch.zeros(1, 2),)) == 0


def test_unet_builder_takes_the_input_size() -> None:
    from codec_tosa_examples.models.vision import unet

    model, inputs = unet(size=64)
    assert [tuple(x.shape) for x in inputs] == [(1, 3, 64, 64)]
    with torch.no_grad():
        assert tuple(model(*inputs).shape) == (1, 1, 64, 64)
