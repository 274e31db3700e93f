"""A Marian checkpoint that `trainer.convert` cannot take is one line naming the file and
what is wrong, and no model directory: real copies of a fixture
(tests/fixtures/marian), damaged as a partial download or a foreign model leaves them."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from programs import program
from trainer.conversion import ConversionError, marian

FIXTURE = Path(__file__).parent / "fixtures" / "marian" / "shared_swish"


@pytest.fixture
def checkpoint(tmp_path):
    copy = tmp_path / "opus-mt"
    shutil.copytree(FIXTURE, copy)
    return copy


def conversion_error(checkpoint, tmp_path):
    """The ConversionError's message; asserts that no model directory was left."""
    model_dir = tmp_path / "converted"
    with pytest.raises(ConversionError) as raised:
        marian.convert(str(checkpoint), str(model_dir))
    assert [p.name for p in tmp_path.iterdir()] == ["opus-mt"], "nothing left but the input"
    message = str(raised.value)
    assert "\n" not in message
    return message


def rewrite_header(path, change):
    """Rewrites a safetensors file's JSON header with change(header); the data stays."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    change(header)
    encoded = json.dumps(header).encode()
    path.write_bytes(len(encoded).to_bytes(8, "little") + encoded + data[8 + size:])


def test_a_missing_file_is_named(checkpoint, tmp_path):
    (checkpoint / "target.spm").unlink()
    assert conversion_error(checkpoint, tmp_path).startswith(f"{checkpoint}/target.spm is missing")


@pytest.mark.parametrize("change, expected", [
    ({"normalize_before": True}, "pre-norm blocks (normalize_before) are not supported"),
    ({"model_type": "bart"}, "model_type is 'bart', not 'marian'"),
    ({"decoder_ffn_dim": 99}, "differs from decoder_ffn_dim=99"),
    ({"activation_function": "tanh"}, "activation_function 'tanh' is not one of"),
])
def test_an_architecture_this_project_cannot_express_is_named(checkpoint, tmp_path, change,
                                                               expected):
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, **change}))
    message = conversion_error(checkpoint, tmp_path)
    assert message.startswith(f"{checkpoint}/config.json: ") and expected in message, message


def test_a_missing_tensor_and_a_tensor_of_the_wrong_shape_are_named(checkpoint, tmp_path):
    weights = checkpoint / "model.safetensors"
    name = "model.decoder.layers.1.fc1.weight"
    original = weights.read_bytes()
    rewrite_header(weights, lambda header: header.pop(name))
    assert conversion_error(checkpoint, tmp_path) == f"{weights} has no tensor {name}"
    weights.write_bytes(original)
    rewrite_header(weights, lambda header: header[name].update(shape=header[name]["shape"][::-1]))
    message = conversion_error(checkpoint, tmp_path)
    assert message == (f"{weights}: tensor {name} has shape [32, 64], but config.json implies "
                       "[64, 32]"), message


def test_a_truncated_weights_file_is_named(checkpoint, tmp_path):
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    message = conversion_error(checkpoint, tmp_path)
    assert message.startswith(f"{weights} is cut short"), message


def test_a_vocabulary_that_does_not_match_the_embeddings_is_named(checkpoint, tmp_path):
    vocab = json.loads((checkpoint / "vocab.json").read_text())
    vocab.popitem()  # <pad>, the last id
    (checkpoint / "vocab.json").write_text(json.dumps(vocab))
    message = conversion_error(checkpoint, tmp_path)
    assert message.startswith(f"{checkpoint}/vocab.json has {len(vocab)} pieces, but the "
                              f"embedding it indexes has {len(vocab) + 1} rows"), message


def test_a_pickled_checkpoint_is_read_only_by_torchs_weights_only_loader(checkpoint, tmp_path):
    (checkpoint / "model.safetensors").rename(checkpoint / "pytorch_model.bin")
    if importlib.util.find_spec("torch") is None:
        message = conversion_error(checkpoint, tmp_path)
        assert message.startswith(f"{checkpoint}/pytorch_model.bin is a pickled PyTorch file"
                                  ) and "convert it to model.safetensors" in message, message
    else:  # a safetensors file is no pickle: torch's safe loader refuses it, named
        message = conversion_error(checkpoint, tmp_path)
        assert "weights_only loader" in message, message


@pytest.mark.slow
def test_the_convert_program_says_it_in_one_line_and_exits_2(checkpoint, tmp_path):
    (checkpoint / "vocab.json").write_text("{")
    result = program("convert", f"--input={checkpoint}", f"--model_dir={tmp_path / 'converted'}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"trainer.convert: error: {checkpoint}/vocab.json is not valid JSON")
    assert not (tmp_path / "converted").exists()
