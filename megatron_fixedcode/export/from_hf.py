"""placeholder"""
def convert_hf_to_megatron(*a, **k):
    raise NotImplementedError
