"""Reference model code: toy models and Llama-family decoders."""
