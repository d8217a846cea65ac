"""The VGF target: TOSA -> VGF (ML SDK for Vulkan) and running VGFs on the emulation layer.

See docs/DESIGN.md, "The VGF target". `convert` needs only the model-converter
wheel; `run_vgf` needs all four ML SDK wheels and, from apt, the Vulkan loader
and lavapipe.
"""

from codec_tosa.targets.vgf.convert import convert, converter_version
from codec_tosa.targets.vgf.errors import ConversionError, NoVulkanDevice, ScenarioError, VgfError, VgfToolMissing
from codec_tosa.targets.vgf.run import run_vgf
from codec_tosa.targets.vgf.tools import VgfTools, vgf_tools

__all__ = ["ConversionError", "NoVulkanDevice", "ScenarioError", "VgfError", "VgfToolMissing", "VgfTools",
           "convert", "converter_version", "run_vgf", "vgf_tools"]
