"""A Marian model of OPUS-MT's size with random weights, saved as Hugging Face saves an
OPUS-MT checkpoint, for timing the converted model against CTranslate2 (bench/decoding.py).
Needs torch and transformers (benchmark-only installs, like the other peers).

The model is opus-mt-en-de's: 6 + 6 layers, d_model 512, 8 heads, d_ff 2048, swish, a
shared vocabulary of 58,101 ids. The vocabulary: SentencePiece unigram models trained on
the Multi30k training text (6,000 pieces a side, Marian's special ids), their pieces first,
then unused pieces up to 58,100, then <pad>.

Random weights translate into one token repeated until the length limit, and the two
engines set that limit differently (CTranslate2 per call, this project per sentence: source
+ 50), so they would decode different outputs of a length no translation has. Raising EOS's
output bias did not fix it (bench/runs.md, "Pretrained models (OPUS-MT), run by run"): with
beam 4 and length penalty 0, CTranslate2's search stops only when a step's best candidate
is EOS, which on nearly flat distributions never happens. So the weights are random but
shaped to end every output after --output_length pieces (15 by default: test2016's German
references average 14.9 pieces in this target vocabulary), with EOS ranking first:
- every residual branch (attention and feed-forward outputs) is scaled by 0.1, so that the
  decoder's last hidden state stays near LayerNorm(embedding of the previous piece +
  position): the previous piece scores highest and repeats;
- EOS's embedding, which Marian shares with the output projection, is the position
  encoding of the step where the output should end, restricted to its fast sines and
  cosines (periods under 21 positions), and every other embedding loses its component
  along it: EOS's logit then depends on the position alone, near 0 until two steps before
  that step, where it overtakes the repeated piece's. (Without that projection, some first
  pieces give EOS a high logit at once, and beam search finds one-word outputs that
  CTranslate2's search, which takes EOS only among its beam-size best candidates, misses.)
The outputs are then one piece repeated 15 times, the same in both engines, and each batch
costs what a batch of 15-piece translations would. A self-check decodes 4 sentences
greedily with transformers and prints their lengths.

    python bench/peers/marian_base.py --data=../shared/data/multi30k --out=/tmp/opus-mt-base
    python -m trainer.convert --from=marian --input=/tmp/opus-mt-base \
        --model_dir=runs/opus-mt-base
"""

import argparse
import gzip
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for common
import common  # noqa: E402

VOCAB_SIZE = 58101  # opus-mt-en-de's
PIECES = 6000
BRANCH_SCALE = 0.1  # residual branches' outputs: the decoder's state stays near its input
FAST_RATE = 0.3  # position encoding rates (radians a position) that EOS's embedding keeps
EOS_NORM = 1.5  # EOS's logit overtakes the repeated piece's one or two steps before the end


def train_spm(path_in, path_out):
    import sentencepiece as spm
    with gzip.open(path_in, "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_prefix=path_out,
                                   vocab_size=PIECES, model_type="unigram",
                                   character_coverage=1.0, minloglevel=2)
    os.rename(path_out + ".model", path_out)
    os.remove(path_out + ".vocab")
    return spm.SentencePieceProcessor(model_file=path_out)


def end_outputs(model, length: int):
    """Shapes `model` (a MarianMTModel) so that every output ends after `length` pieces: the
    residual branches scaled by BRANCH_SCALE, EOS's embedding the fast part of the position
    encoding of the step that should be EOS, and the other embeddings orthogonal to it (see
    the module docstring)."""
    import torch
    layers = list(model.model.encoder.layers) + list(model.model.decoder.layers)
    with torch.no_grad():
        for layer in layers:
            branches = [layer.self_attn.out_proj, layer.fc2]
            if hasattr(layer, "encoder_attn"):
                branches.append(layer.encoder_attn.out_proj)
            for branch in branches:
                branch.weight.mul_(BRANCH_SCALE)
                branch.bias.mul_(BRANCH_SCALE)
        half = model.config.d_model // 2
        rates = 1.0 / 10000.0 ** (torch.arange(half) / half)
        fast = (rates >= FAST_RATE).repeat(2)  # Marian's layout: all sines, then all cosines
        end = model.model.decoder.embed_positions.weight[length + 1] * fast
        end = end / end.norm()
        embeddings = model.model.shared.weight
        embeddings -= (embeddings @ end)[:, None] * end[None, :]
        embeddings[model.config.eos_token_id] = EOS_NORM * end


def self_check(model, checkpoint_dir, text_path):
    """Greedy output lengths of the first 4 sentences of `text_path`, in pieces before EOS."""
    import torch
    from transformers import MarianTokenizer
    tokenizer = MarianTokenizer.from_pretrained(checkpoint_dir)
    texts = common.read_lines(text_path, 4)
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=100)
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    return [int(((row != pad) & (row != eos)).sum()) for row in out]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="directory with train.en.gz, train.de.gz")
    parser.add_argument("--out", required=True, help="the checkpoint directory to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_length", type=int, default=15,
                        help="pieces in every output before EOS (15: test2016's mean)")
    args = parser.parse_args()
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    os.makedirs(args.out, exist_ok=True)
    vocab = {"</s>": 0, "<unk>": 1}
    for side, lang in (("source", "en"), ("target", "de")):
        processor = train_spm(os.path.join(args.data, f"train.{lang}.gz"),
                              os.path.join(args.out, f"{side}.spm"))
        for i in range(processor.get_piece_size()):
            if not (processor.is_control(i) or processor.is_unknown(i)):
                vocab.setdefault(processor.id_to_piece(i), len(vocab))
    filler = 0
    while len(vocab) < VOCAB_SIZE - 1:
        vocab.setdefault(f"<unused{filler}>", len(vocab))
        filler += 1
    vocab["<pad>"] = VOCAB_SIZE - 1
    with open(os.path.join(args.out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    config = MarianConfig(
        vocab_size=VOCAB_SIZE, d_model=512, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
        decoder_ffn_dim=2048, activation_function="swish", max_position_embeddings=512,
        scale_embedding=True, pad_token_id=VOCAB_SIZE - 1, eos_token_id=0,
        decoder_start_token_id=VOCAB_SIZE - 1, forced_eos_token_id=0)
    torch.manual_seed(args.seed)
    model = MarianMTModel(config).eval()
    end_outputs(model, args.output_length)
    # opus-mt-en-de's search, which trainer.convert reads and stores (without it the
    # converted model would search as Transformers' defaults do: beam 1, 20 positions).
    model.generation_config = GenerationConfig(
        num_beams=4, max_length=512, bad_words_ids=[[VOCAB_SIZE - 1]], bos_token_id=0,
        eos_token_id=0, forced_eos_token_id=0, pad_token_id=VOCAB_SIZE - 1,
        decoder_start_token_id=VOCAB_SIZE - 1)
    model.save_pretrained(args.out, safe_serialization=True)
    print(f"wrote {args.out}: {VOCAB_SIZE} ids, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    print("greedy output lengths (pieces before EOS) of 4 test2016 sentences:",
          self_check(model, args.out, os.path.join(args.data, "test2016.en")))


if __name__ == "__main__":
    main()
