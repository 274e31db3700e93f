"""The application: flags, data, tokenizer, training loop, export and CLIs."""
