"""Run a VGF on this machine: the ML emulation layers over lavapipe (docs/DESIGN.md, "The VGF target").

`vgf_dump --scenario-template` describes the VGF's inputs and outputs; the
template is filled in with .npy files and handed to scenario_runner in a
temporary directory. The Vulkan environment is built here for the child
process only: the user sets nothing, and this process's environment is not
changed. lavapipe is a functional check, not a speed claim.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from codec_tosa.targets.vgf.errors import NoVulkanDevice, ScenarioError
from codec_tosa.targets.vgf.tools import APT_PACKAGES, lavapipe_icd, vgf_tools

RUN_TIMEOUT_S = 1800.0  # lavapipe compiles every shader on the CPU: large models take minutes
_INPUT = re.compile(r"TEMPLATE_PATH_TENSOR_INPUT_(\d+)$")
_OUTPUT = re.compile(r"TEMPLATE_PATH_TENSOR_OUTPUT_(\d+)$")
# VkFormat of a scenario tensor -> numpy dtype (the formats VGF tensors use)
FORMAT_DTYPES: dict[str, np.dtype[Any]] = {
    "VK_FORMAT_R8_BOOL_ARM": np.dtype(np.bool_),
    "VK_FORMAT_R8_SINT": np.dtype(np.int8),
    "VK_FORMAT_R8_UINT": np.dtype(np.uint8),
    "VK_FORMAT_R16_SINT": np.dtype(np.int16),
    "VK_FORMAT_R16_UINT": np.dtype(np.uint16),
    "VK_FORMAT_R16_SFLOAT": np.dtype(np.float16),
    "VK_FORMAT_R32_SINT": np.dtype(np.int32),
    "VK_FORMAT_R32_UINT": np.dtype(np.uint32),
    "VK_FORMAT_R32_SFLOAT": np.dtype(np.float32),
    "VK_FORMAT_R64_SINT": np.dtype(np.int64),
}
# loader/driver failures that mean "no usable Vulkan device" rather than a bad VGF
_NO_DEVICE = ("createInstance", "enumeratePhysicalDevices", "ErrorIncompatibleDriver",
              "ErrorInitializationFailed", "no physical device", "No suitable device")


def run_vgf(vgf_bytes: bytes, inputs: Sequence[np.ndarray], label: str = "VGF") -> list[np.ndarray]:
    """The VGF's outputs for `inputs` (in the VGF's input order), computed by scenario_runner."""
    tools = vgf_tools()
    icd = lavapipe_icd()
    with tempfile.TemporaryDirectory(prefix="codec-tosa-vgf-run-") as tmp_name:
        tmp = Path(tmp_name)
        model = tmp / "model.vgf"
        model.write_bytes(vgf_bytes)
        template = _scenario_template(tools.vgf_dump, model, label)
        scenario, output_files = fill_scenario(template, model, list(inputs), tmp, label)
        (tmp / "scenario.json").write_text(json.dumps(scenario, indent=1))
        try:
            done = subprocess.run(
                [str(tools.scenario_runner), "--scenario", str(tmp / "scenario.json"), "--output", str(tmp)],
                cwd=tmp, env=tools.vulkan_env(icd), capture_output=True, text=True,
                timeout=RUN_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise ScenarioError(f"{label}: scenario_runner did not finish in {RUN_TIMEOUT_S:.0f} s") from None
        log = f"{done.stdout}\n{done.stderr}"
        if done.returncode != 0 or not all(f.exists() for f, _ in output_files):
            raise scenario_error(label, log, done.returncode)
        return [np.load(f).reshape(dims) for f, dims in output_files]


def _scenario_template(vgf_dump: Path, model: Path, label: str) -> dict[str, Any]:
    target = model.with_name("template.json")
    done = subprocess.run([str(vgf_dump), "-i", str(model), "--scenario-template", "-o", str(target)],
                          capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0 or not target.exists():
        message = _first_line(f"{done.stderr}\n{done.stdout}") or f"exit status {done.returncode}"
        raise ScenarioError(f"{label}: vgf_dump cannot read the VGF: \"{message}\"")
    return json.loads(target.read_text())


def fill_scenario(template: dict[str, Any], model: Path, inputs: list[np.ndarray], directory: Path,
                  label: str = "VGF") -> tuple[dict[str, Any], list[tuple[Path, tuple[int, ...]]]]:
    """The template with the inputs written as .npy files and the outputs named.

    Returns the scenario and, per output in order, its file and shape. An
    input must match its tensor's element type and element count exactly: a
    silent cast would hide a wiring error the comparison is there to find.
    """
    scenario = json.loads(json.dumps(template))  # a deep copy
    outputs: dict[int, tuple[Path, tuple[int, ...]]] = {}
    expected_inputs = 0
    for resource in scenario.get("resources", []):
        if "graph" in resource:
            resource["graph"]["src"] = str(model)
        tensor = resource.get("tensor")
        if tensor is None:
            continue
        dims = tuple(int(d) for d in tensor.get("dims", []))
        found = _INPUT.match(str(tensor.get("src", "")))
        if found:
            k = int(found.group(1))
            expected_inputs = max(expected_inputs, k + 1)
            if k >= len(inputs):
                continue  # reported below, with the count
            path = directory / f"input_{k}.npy"
            np.save(path, _as_tensor(inputs[k], tensor.get("format", ""), dims, f"{label}: input {k}"))
            tensor["src"] = str(path)
        found = _OUTPUT.match(str(tensor.get("dst", "")))
        if found:
            k = int(found.group(1))
            path = directory / f"output_{k}.npy"
            tensor["dst"] = str(path)
            outputs[k] = (path, dims)
    if expected_inputs != len(inputs):
        raise ValueError(f"{label}: the VGF takes {expected_inputs} input(s), {len(inputs)} given")
    for command in scenario.get("commands", []):
        if "dispatch_graph" in command:  # deprecated in scenario_runner 0.11 in favour of dispatch_vgf
            command["dispatch_vgf"] = command.pop("dispatch_graph")
    return scenario, [outputs[k] for k in sorted(outputs)]


def _as_tensor(value: np.ndarray, vk_format: str, dims: tuple[int, ...], what: str) -> np.ndarray:
    array = np.asarray(value)
    dtype = FORMAT_DTYPES.get(vk_format)
    if dtype is None:
        raise ValueError(f"{what}: tensor format {vk_format} has no numpy type here")
    if array.dtype != dtype:
        raise ValueError(f"{what}: {array.dtype} given, the VGF tensor is {dtype} ({vk_format})")
    if array.size != int(np.prod(dims, dtype=np.int64)):
        raise ValueError(f"{what}: shape {list(array.shape)} given, the VGF tensor is {list(dims)}")
    return np.ascontiguousarray(array.reshape(dims))


def scenario_error(label: str, log: str, returncode: int) -> ScenarioError:
    """NoVulkanDevice when the loader or driver failed, else ScenarioError quoting the runner."""
    errors = [ln for ln in log.splitlines() if "ERROR" in ln or "error:" in ln.lower()]
    line = _strip_log_prefix(errors[0]) if errors else (_first_line(log) or f"exit status {returncode}")
    if any(marker.lower() in line.lower() for marker in _NO_DEVICE):
        return NoVulkanDevice(f"{label}: no usable Vulkan device for the ML emulation layers "
                              f"(scenario_runner: \"{line}\"); apt-get install -y {APT_PACKAGES}")
    return ScenarioError(f"{label}: scenario_runner failed: \"{line}\"")


def _strip_log_prefix(line: str) -> str:
    # "2026-01-01 12:00:00,000 [Scenario-Runner] ERROR: message" -> "message"
    return re.sub(r"^.*?\[Scenario-Runner\]\s+ERROR:\s*", "", line.strip())


def _first_line(text: str) -> str | None:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), None)


__all__ = ["FORMAT_DTYPES", "fill_scenario", "run_vgf", "scenario_error"]
