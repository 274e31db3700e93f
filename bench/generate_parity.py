"""Benchmark of fidelity, not speed: does Transformers' generate() translate a model trained
here, exported with `trainer.export --format=marian`, as this project's search does?

For each model (the builtin corpus, `python -m trainer.task` for a few hundred updates:
the tiny preset, post-norm, relu, shared or separate vocabularies, each with its own seed),
the script exports the Marian checkpoint, runs `MarianMTModel.generate()` with the
exported generation_config.json on --sentences inputs of the builtin corpus's kind, and
counts the outputs equal to:

  - direct: `beam_search` on the model itself with generate()'s settings (its beam size,
    the `average` penalty at its length_penalty, `stopping="transformers"`, its
    max_length). The numbers are not quite Marian's: the model's softmax also spreads
    over its PAD id, which has no Marian id, and its layer norms add 1e-6 to the variance
    where Marian's add 1e-5;
  - without PAD: the same search with the PAD id left out of each step's softmax (the
    step wrapped here, not an option of the library), which leaves only the epsilon;
  - round trip: the model directory `trainer.convert` makes of the export, searched with
    its stored settings (what its default export does): Marian's numbers, exactly.

For every output that differs, where the two part (the first piece that differs) and
both lengths, EOS counted. Both searches prune (the beam, and generate()'s stopping
guess), so a near tie at one step, which the two softmaxes' small differences can tip,
sends them down different paths from there on.

Needs torch and transformers (benchmark-only installs: bench/README.md says how). About 4
minutes for the default five models. Run it from the repository root:

  python bench/generate_parity.py [--models=100:separate:1,150:shared:2,200:separate:3,300:shared:4,120:separate:5]
                                  [--sentences=60]
"""

import argparse
import dataclasses
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import common
import results_file


def train_and_export(steps: int, vocabularies: str, seed: int, root: Path):
    """(model directory, Marian checkpoint) of a builtin-corpus run of `steps` updates."""
    model_dir, marian_dir = root / "model", root / "marian"
    separate = ["--separate_vocabularies", "--vocab_size=300"] if vocabularies == "separate" else []
    subprocess.run([sys.executable, "-m", "trainer.task", f"--train_steps={steps}",
                    "--warmup_steps=50", "--eval_every=0", f"--checkpoint_every={steps}",
                    f"--log_every={steps}", f"--seed={seed}", *separate,
                    f"--model_dir={model_dir}", "--export_dir=none"],
                   check=True, cwd=root, capture_output=True)
    subprocess.run([sys.executable, "-m", "trainer.export", "--format=marian",
                    f"--model_dir={model_dir}", f"--export_dir={marian_dir}"],
                   check=True, cwd=common.REPO, capture_output=True)
    return model_dir, marian_dir


def without_pad(step):
    """A search step (keras_transformer.search.WrappedStep) whose log-probs are
    renormalized over every id but PAD (which then scores -inf), as Marian's softmax,
    which has no PAD id, normalizes."""
    import tensorflow as tf
    from keras_transformer import PAD_ID
    from keras_transformer.log_probs import as_log_probs
    from keras_transformer.search import WrappedStep

    class WithoutPad(WrappedStep):
        def log_probs(self, log_probs, seqs, i):
            log_probs = as_log_probs(log_probs)
            pad = log_probs[:, PAD_ID:PAD_ID + 1]
            log_probs = log_probs - tf.math.log1p(-tf.exp(pad))
            is_pad = tf.range(tf.shape(log_probs)[1]) == PAD_ID
            return tf.where(is_pad, float("-inf"), log_probs)

    return WithoutPad(step)


def generates(settings: dict):
    """The DecodeConfig of generate()'s search with a generation_config.json's settings:
    what a converted checkpoint's model directory stores (trainer/conversion/marian.py)."""
    from keras_transformer import DecodeConfig
    return DecodeConfig(beam_size=settings["num_beams"], alpha=settings["length_penalty"],
                        length_penalty="average", stopping="transformers",
                        max_length=settings["max_length"],
                        max_extra_length=settings["max_length"])


def our_search(model, source_ids, decode, without_pad_ids=False):
    """The model's best outputs [batch] (ids, EOS cut) under the DecodeConfig `decode`."""
    from keras_transformer import TransformerStep, beam_search
    step = TransformerStep(model, source_ids)
    result = beam_search(without_pad(step) if without_pad_ids else step,
                         dataclasses.replace(decode, num_hypotheses=1))
    return [row[:n - 1] for row, n in zip(result.ids[:, 0].numpy().tolist(),
                                          result.lengths[:, 0].numpy().tolist())]


def compare(model_dir: Path, marian_dir: Path, inputs, root: Path) -> dict:
    """One model's row: outputs' lengths, and how many of generate()'s outputs each of
    our searches gives, and where the direct search's differing outputs part from
    generate()'s."""
    import tensorflow as tf
    import torch
    import transformers
    from trainer.conversion import marian
    from trainer.data import vocabulary
    from trainer.model_dir import layout
    from trainer.serving.translator import Translator
    hf = transformers.MarianMTModel.from_pretrained(str(marian_dir)).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(marian_dir))
    with torch.no_grad():
        generated = hf.generate(**tokenizer(inputs, return_tensors="pt", padding=True))
    expected = tokenizer.batch_decode(generated, skip_special_tokens=True)
    decode = generates(json.loads((marian_dir / "generation_config.json").read_text()))

    def searched(directory, decode):
        """(model, target tokenizer, source ids, our outputs) of a model directory, its
        inputs read as its exports read them (Translator.source_ids)."""
        translator = Translator(layout.restore_model(str(directory)),
                                vocabulary.load_or_train(str(directory), None))
        source_ids = translator.source_ids(tf.constant(inputs))
        return (translator.model, translator.target_tokenizer, source_ids,
                our_search(translator.model, source_ids, decode))

    def texts(outputs, target):
        return [t.decode() for t in target.detokenize(tf.ragged.constant(outputs)).numpy()]

    model, pieces, source_ids, direct = searched(model_dir, decode)
    no_pad = our_search(model, source_ids, decode, without_pad_ids=True)
    marian.convert(str(marian_dir), str(root / "back"))
    _, back_pieces, _, back = searched(root / "back", layout.load_decode(str(root / "back")))
    found = texts(direct, pieces)
    differing = [i for i, (a, b) in enumerate(zip(found, expected)) if a != b]
    parted = []
    for i in differing:
        theirs = pieces.tokenize(tf.constant([expected[i]])).to_list()[0]
        at = next((j for j, (a, b) in enumerate(zip(direct[i], theirs)) if a != b),
                  min(len(direct[i]), len(theirs)))
        parted.append(f"piece {at + 1} ({len(direct[i]) + 1} / {len(theirs) + 1} tokens)")
    lengths = [len(row) + 1 for row in direct]
    return {"lengths": f"{min(lengths)}-{max(lengths)}",
            "ended": sum(n < decode.max_length - 1 for n in lengths),
            "direct": len(inputs) - len(differing),
            "without_pad": sum(a == b for a, b in zip(texts(no_pad, pieces), expected)),
            "round_trip": sum(a == b for a, b in zip(texts(back, back_pieces), expected)),
            "parted": ", ".join(parted) or "-"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="100:separate:1,150:shared:2,200:separate:3,"
                                            "300:shared:4,120:separate:5",
                        help="STEPS:shared|separate:SEED, comma-separated")
    parser.add_argument("--sentences", type=int, default=60,
                        help="inputs per model, numbers of 1 to 6 digits in words")
    results_file.add_results_flag(parser, "marian-builtin")
    args = parser.parse_args()
    common.require(["torch", "transformers"], "bench/generate_parity.py")
    import transformers
    from trainer.data.builtin_corpus import english
    common.print_header([("machine", common.describe()), ("load", common.load_average()),
                         ("versions", common.versions(
                             f"Transformers {transformers.__version__}")),
                         ("command", common.command())])
    rng = random.Random(5)
    inputs = [english(rng.randrange(1, 10 ** rng.randrange(1, 7))) for _ in range(args.sentences)]
    rows, totals = [], [0, 0, 0]
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.models.split(","):
            steps, vocabularies, seed = spec.split(":")
            root = Path(tmp) / spec.replace(":", "_")
            root.mkdir()
            print(f"training and comparing {spec} ...", file=sys.stderr, flush=True)
            row = compare(*train_and_export(int(steps), vocabularies, int(seed), root),
                          inputs, root)
            for i, key in enumerate(("direct", "without_pad", "round_trip")):
                totals[i] += row[key]
            rows.append([steps, vocabularies, seed, row["lengths"], row["ended"],
                         row["direct"], row["without_pad"], row["round_trip"], row["parted"]])
    n = args.sentences
    rows.append(["all", "", "", "", "", *(f"{t} / {n * len(rows)}" for t in totals), ""])
    common.print_table(
        ["updates", "vocabularies", "seed", "output tokens", "ended before max_length",
         f"same as generate(), direct (of {n})", "without PAD", "round trip",
         "where a direct output parts from generate()'s"],
        rows, text_columns=[0, 1, 8],
        title="generate() on the Marian export against our search with its settings")
    results_file.write_results("generate_parity", args.results,
                         f"Marian exports of builtin models ({args.models}), "
                         f"{args.sentences} inputs each",
                         packages=["torch", "transformers"])


if __name__ == "__main__":
    main()
