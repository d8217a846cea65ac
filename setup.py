"""codec_tosa: an ExecuTorch backend for Arm TOSA with non-local codec placement."""

from setuptools import setup

setup(
    name="codec_tosa",
    version="0.1.0",
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
        "codec_tosa.serialization",
        "codec_tosa.runtime",
        "codec_tosa_examples",
        "codec_tosa_examples.models",
    ],
    package_data={"codec_tosa.runtime": ["cpp/*.cpp", "cpp/*.h"]},
    entry_points={"console_scripts": ["codec-tosa = codec_tosa.cli:main"]},
)
