"""keras-transformer: the Transformer of "Attention Is All You Need" for TensorFlow/Keras."""

from setuptools import find_packages, setup

setup(
    name="keras-transformer",
    version="0.1.0",
    description='The Transformer of "Attention Is All You Need" as Keras 3 layers, with a '
                "multi-GPU trainer, beam search and TF Serving export",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["keras_transformer", "keras_transformer.*", "trainer",
                                    "trainer.*"]),
    package_data={"trainer": ["flagfiles/*.cfg"]},
    python_requires=">=3.10,<3.14",
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "tensorflow-text>=2.21,<2.22",
        "keras>=3.10,<4",
        "tensorflow-datasets>=4.9",
        "sacrebleu>=2.4",
        "absl-py>=2.0",
        "tensorboard>=2.20",
        "sentencepiece>=0.2",
        "sacremoses>=0.1",
        "tensorflow-serving-api>=2.21,<2.22",
        "matplotlib>=3.7",
    ],
    extras_require={
        "ctranslate2": ["ctranslate2>=4.5,<5"],
        # the CTranslate2 export is tested against the real runtime; pytest-xdist runs a
        # test file per core (most tests wait on one subprocess at a time)
        "test": ["pytest>=8", "pytest-xdist>=3.5", "ctranslate2>=4.5,<5"],
    },
    license="Apache-2.0",
)
