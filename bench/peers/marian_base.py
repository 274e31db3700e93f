"""A Marian model of OPUS-MT's size with random weights, saved as Hugging Face saves an
OPUS-MT checkpoint, for timing the converted model against CTranslate2 (bench/decoding.py).
Needs torch and transformers (benchmark-only installs, like the other peers).

The model is opus-mt-en-de's: 6 + 6 layers, d_model 512, 8 heads, d_ff 2048, swish, a
shared vocabulary of 58,101 ids. The vocabulary: SentencePiece unigram models trained on
the Multi30k training text (6,000 pieces a side, Marian's special ids), their pieces first,
then unused pieces up to 58,100, then <pad>.

Random weights translate into one token repeated until the length limit, which
CTranslate2 sets per call and this project per sentence (source + 50), so the two would
decode different outputs, and longer ones than a translation. --eos_bias raises EOS's entry
of Marian's `final_logits_bias` (the output bias, 0 in a new model) so that the outputs end:
at 1.5, after 16 to 19 pieces, in both engines. Not yet enough for a fair timing: with
beam 4 and length penalty 0, CTranslate2 still runs every batch to its max_decoding_length
(16 sentences: 3.0 s at 40, 6.4 s at 80, the same outputs), where our search stops once no
live hypothesis can beat a finished one. 15 minutes of fine-tuning on Multi30k (190
updates) did not end the outputs either: it made every output the same repeated sentence.
docs/runs.md ("Issue 42: pretrained models, run by run") keeps what was measured.

    python bench/peers/marian_base.py --data=../shared/data/multi30k --eos_bias=1.5 \
        --out=/tmp/opus-mt-base
    python -m trainer.convert --from=marian --input=/tmp/opus-mt-base \
        --model_dir=runs/opus-mt-base
"""

import argparse
import gzip
import json
import os

VOCAB_SIZE = 58101  # opus-mt-en-de's
PIECES = 6000


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="directory with train.en.gz, train.de.gz")
    parser.add_argument("--out", required=True, help="the checkpoint directory to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eos_bias", type=float, default=0.0,
                        help="EOS's entry of final_logits_bias: > 0 ends the outputs sooner")
    args = parser.parse_args()
    import torch
    from transformers import MarianConfig, MarianMTModel

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
    with torch.no_grad():
        model.final_logits_bias[0, config.eos_token_id] = args.eos_bias
    model.save_pretrained(args.out, safe_serialization=True)
    print(f"wrote {args.out}: {VOCAB_SIZE} ids, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"EOS bias {args.eos_bias}")


if __name__ == "__main__":
    main()
