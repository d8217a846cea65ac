"""codec_tosa: an ExecuTorch backend for Arm TOSA with non-local codec placement."""

from pathlib import Path

from setuptools import setup


def _pins(name: str) -> list[str]:
    """The exact pins of requirements/NAME.txt (one source for pip and setup.py)."""
    lines = (Path(__file__).parent / "requirements" / f"{name}.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


setup(
    name="codec_tosa",
    version="0.2.0",
    description="ExecuTorch TOSA backend with non-local compressed-operand codec placement",
    python_requires=">=3.11,<3.12",
    package_dir={
        "codec_tosa": "backends/codec_tosa",
        "codec_tosa_examples": "examples",
    },
    packages=[
        "codec_tosa",
        "codec_tosa.commutation",
        "codec_tosa.placement",
        "codec_tosa.codecs",
        "codec_tosa._passes",
        "codec_tosa.serialization",
        "codec_tosa.runtime",
        "codec_tosa.targets.vgf",
        "codec_tosa.tools",
        "codec_tosa.tools.tables",
        "codec_tosa_examples",
        "codec_tosa_examples.models",
        "codec_tosa_examples.models.trained",
    ],
    package_data={"codec_tosa.runtime": ["cpp/*.cpp", "cpp/*.h"],
                  "codec_tosa_examples.models.trained": ["weights/*.pt", "weights/manifest.json"]},
    install_requires=_pins("base"),
    extras_require={"models": _pins("models"), "dev": _pins("dev")},
    entry_points={"console_scripts": ["codec-tosa = codec_tosa.tools.cli:main"]},
)
