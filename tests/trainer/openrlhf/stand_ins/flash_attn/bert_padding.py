"""CPU-test stand-in (see ../README.md)."""

from flash_attn import unavailable

index_first_axis = unavailable("bert_padding.index_first_axis")
pad_input = unavailable("bert_padding.pad_input")
rearrange = unavailable("bert_padding.rearrange")
unpad_input = unavailable("bert_padding.unpad_input")
