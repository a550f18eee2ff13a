"""Which files Megatron-LM's tokenizer flags name (no tokenizer library imported: parsers use it)."""

from typing import Optional


def tokenizer_files(a) -> tuple[Optional[str], Optional[str]]:
    """(tokenizer path, merge file) Megatron-LM's flags name (an argparse namespace): --vocab-file and
    --merge-file for GPT2BPETokenizer, else --tokenizer-model. Combinations Megatron-LM would not read
    are refused (ValueError, one line)."""
    vocab, merges = getattr(a, "vocab_file", None), getattr(a, "merge_file", None)
    if a.tokenizer_type != "GPT2BPETokenizer":
        if vocab or merges:
            flag = "--vocab-file" if vocab else "--merge-file"
            raise ValueError(f"{flag}: read with --tokenizer-type GPT2BPETokenizer (GPT-2 BPE vocab.json + merges.txt) "
                             f"only, not {a.tokenizer_type}")
        return a.tokenizer_model, None
    if a.tokenizer_model:
        raise ValueError("--tokenizer-type GPT2BPETokenizer reads --vocab-file and --merge-file: drop --tokenizer-model")
    if bool(vocab) != bool(merges):
        raise ValueError(f"--tokenizer-type GPT2BPETokenizer needs both --vocab-file and --merge-file "
                         f"(got only {'--vocab-file' if vocab else '--merge-file'})")
    return vocab, merges
