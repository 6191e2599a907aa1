"""A tiny random-weight Llama with a locally trained tokenizer and a chat template.

Its text is meaningless, but it is a real model to vLLM: real attention, a real KV
cache, real guided decoding. Head size 64, because the CPU attention kernels support it.
Built in seconds, deterministic with fixed seeds.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# ChatML, with BOS written by the template (so encoding must not add a second one).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048):
    """A byte-level BPE tokenizer that adds BOS when asked for special tokens, like Llama's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [BOS, EOS, PAD, IM_START, IM_END]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
    )


def build_model(
    directory: Path,
    texts: Iterable[str],
    seed: int = 0,
    chat: bool = True,
    reasoning: bool = False,
) -> Path:
    """Write a tokenizer and random Llama weights to ``directory``; returns it.
    ``reasoning``: the variant with think tokens and a template that opens thinking
    (``demo.reasoning``)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(texts)
    if not chat:
        tokenizer.chat_template = None
    if reasoning:
        from nightshift.demo.reasoning import add_think_tokens

        add_think_tokens(tokenizer)
    tokenizer.save_pretrained(directory)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(directory)
    return directory
