"""Other toolkits' file formats, which the conversion reads (trainer/conversion/) and the
exports write (trainer/serving/): below both, so that neither imports the other.

  marian.py       a Hugging Face Marian checkpoint's files and the name of each of our
                  weights in it
  safetensors.py  Hugging Face's tensor files, read and written without torch
"""
