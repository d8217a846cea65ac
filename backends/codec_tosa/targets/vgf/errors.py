"""Errors of the VGF target, each a one-line message saying what to do (docs/DESIGN.md, "The VGF target")."""

from __future__ import annotations


class VgfError(RuntimeError):
    """Base of every VGF-target error; the message is one line."""


class VgfToolMissing(VgfError):
    """A pip or apt package the VGF target needs is not installed; the message names it."""


class ConversionError(VgfError):
    """model-converter rejected a TOSA flatbuffer; `operator` is the TOSA operator it named, if any."""

    def __init__(self, message: str, operator: str | None = None, converter_output: str = "") -> None:
        super().__init__(message)
        self.operator = operator
        self.converter_output = converter_output


class NoVulkanDevice(VgfError):
    """The Vulkan loader found no device to run a VGF on."""


class ScenarioError(VgfError):
    """scenario_runner failed on a VGF that converted."""


__all__ = ["ConversionError", "NoVulkanDevice", "ScenarioError", "VgfError", "VgfToolMissing"]
