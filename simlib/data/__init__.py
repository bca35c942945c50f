"""Corpora: the shipped King James Bible, streaming loaders for larger text files, and a vocabulary."""
from simlib.data.corpus import KJV_PATH, Corpus, Vocabulary, iter_text8, iter_text_file, load_kjv, tokenize

__all__ = ["Corpus", "Vocabulary", "load_kjv", "iter_text_file", "iter_text8", "tokenize", "KJV_PATH"]
