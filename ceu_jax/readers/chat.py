"""ChatML prompt formatting, read from a GGUF file's `tokenizer.chat_template`.

SmolLM2-135M-Instruct's template (a Jinja string) renders

    [<|im_start|>system\\n{default system}<|im_end|>\\n   when no system message is given]
    <|im_start|>{role}\\n{content}<|im_end|>\\n            for each message
    <|im_start|>assistant\\n                               (the generation prompt)

Jinja is not a dependency, so we do not execute the template: we check that it
is ChatML (both markers present) and take its default system message from it;
`ChatTemplate.render` reproduces the template's output for that family.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Optional, Sequence, Union

IM_START, IM_END = '<|im_start|>', '<|im_end|>'
Message = tuple[str, str]  # (role, content); roles: system | user | assistant
ChatPrompt = Union[str, Sequence[Message]]  # a user message, or a whole conversation

_DEFAULT_SYSTEM = re.compile(re.escape(IM_START) + r'system\n(.*?)' + re.escape(IM_END), re.S)


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """ChatML with the default system message of the source template."""
  default_system: Optional[str]  # inserted when the conversation has no system message

  @classmethod
  def from_template(cls, template: str) -> 'ChatTemplate':
    """Parse a Jinja chat template; ValueError unless it is ChatML."""
    if IM_START not in template or IM_END not in template:
      raise ValueError(f'chat template is not ChatML (no {IM_START} / {IM_END}): '
                       f'{template[:200]!r}')
    m = _DEFAULT_SYSTEM.search(template)
    return cls(default_system=m.group(1) if m else None)

  def render(self, prompt: ChatPrompt, system: Optional[str] = None,
             add_generation_prompt: bool = True) -> str:
    """The ChatML text of a conversation (a str is one user message).

    `system` (when given) is placed as the first message; otherwise the
    template's default system message is, unless the conversation starts with
    its own system message.
    """
    messages = [('user', prompt)] if isinstance(prompt, str) else [tuple(m) for m in prompt]
    for m in messages:
      if len(m) != 2 or not all(isinstance(x, str) for x in m):
        raise ValueError(f'a chat message must be a (role, content) pair of strings, got {m!r}')
    if system is not None:
      messages = [('system', system)] + messages
    out = []
    if self.default_system is not None and (not messages or messages[0][0] != 'system'):
      out.append(f'{IM_START}system\n{self.default_system}{IM_END}\n')
    out += [f'{IM_START}{role}\n{content}{IM_END}\n' for role, content in messages]
    if add_generation_prompt:
      out.append(f'{IM_START}assistant\n')
    return ''.join(out)


@functools.lru_cache(maxsize=2)
def gguf_chat_template(path: Optional[str] = None) -> Optional[str]:
  """The `tokenizer.chat_template` string of a GGUF file (None when it has none)."""
  from ceu_jax.pretrained.gguf_loader import open_gguf
  field = open_gguf(path).fields.get('tokenizer.chat_template')
  return None if field is None else field.contents()
