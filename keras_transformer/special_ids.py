"""The token ids every vocabulary of the project reserves, the same in the model, the
tokenizer, the input pipeline and the decoders.

Pure Python, so a program can read them without importing TensorFlow.

>>> from keras_transformer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
>>> PAD_ID, UNK_ID, BOS_ID, EOS_ID
(0, 1, 2, 3)
"""

# Padding: the model masks it in attention and in the loss.
PAD_ID = 0
# Unknown piece (byte fallback makes it rare in text; ids outside the vocabulary map to it).
UNK_ID = 1
# Beginning of sequence: the decoder's input at position 0 (the outputs "shifted right").
BOS_ID = 2
# End of sequence: closes every source and every target.
EOS_ID = 3
