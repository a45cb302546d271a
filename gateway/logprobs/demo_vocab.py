"""A small byte-level BPE vocabulary the project trains itself, for offline demos and tests.

Real tokenizers need files or the network; this one is trained in-process, in a fraction of a second,
from the English text below. That text has no CJK or emoji, so such characters fall apart into
single-byte tokens: the partial characters the logprob machinery exists to carry exactly.
"""

from __future__ import annotations

import functools

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from gateway.logprobs.vocab import HFVocab

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
# A cap: the trainer stops earlier, at about 1,230 tokens, once every word of the corpus is one token.
VOCAB_SIZE = 2000

# Written for this module. Plain ASCII on purpose (see the module docstring); a little code and a
# few numbers so that demo prompts of either kind tokenize into plausible pieces.
CORPUS = """\
The gateway sits between the client and the model server. A client sends a request, the gateway
translates it, and the server answers with text and, when asked, the log probability of every token.
Those numbers tell you how sure the model was about each piece of its answer.

A token is not a word. It is a short run of bytes that the tokenizer learned to treat as one unit.
Common words are usually one token; rare words are split into several pieces; and a character that
the tokenizer has never seen may be split into single bytes, which are not readable on their own.

Hello! How are you today? I am fine, thank you. The weather is mild this morning, with a light wind
from the west and a few clouds over the hills. In the afternoon it may rain, so take a coat with you
when you go out, and do not forget to close the window before you leave the house.

The old lighthouse stood at the end of the harbour for more than one hundred years. Every night the
keeper climbed the stairs, cleaned the glass, and lit the lamp. Ships far out at sea saw the light
turning slowly and knew where the rocks were. When the keeper grew old, his daughter took over the
work, and she kept the lamp burning through the longest storms of the winter.

To make bread, mix flour, water, salt and a little yeast in a large bowl. Knead the dough for ten
minutes until it is smooth, then let it rise in a warm place for about an hour. Shape the loaf, let
it rise again, and bake it in a hot oven for thirty to forty minutes, until the crust is golden brown.

def add(a, b):
    return a + b

def greet(name):
    print("Hello, " + name + "!")
    return len(name)

for i in range(10):
    total = add(total, i)

Numbers come in many forms: 1, 2, 3, 10, 42, 100, 2024, 3.14 and 0.5. A list may hold the values
[1, 2, 3], a dictionary may map the key "name" to the value "model", and a sentence may end with a
question mark? Or with an exclamation mark! Or simply with a full stop.

The river runs quietly through the valley. In spring the water is cold and fast, and in summer it
is warm and slow. Children play on the banks, fishermen wait for hours in the shade, and in the
evening the birds come down to drink before the sun goes down behind the mountains.

Good software is written for people first and for machines second. Name things by what they do,
keep functions short, test the behaviour that matters, and write down why a piece of code exists
when the reason is not obvious. The next person to read it will thank you, even if it is you.

She said that the train would leave at seven, but it was late again. We waited on the platform,
talked about the news, and watched the station clock. When the train finally arrived, every seat was
taken, so we stood by the door and looked out at the fields, the farms and the small towns passing by.

A good answer starts with a clear question. What do you want to know, and why? Which facts do you
already have, and which ones are missing? Write them down, check each one, and only then decide. If
the evidence changes, change your mind; there is no shame in that, only in refusing to look again.

The library opens at nine in the morning and closes at six in the evening. Members may borrow up to
five books at a time for three weeks. Newspapers, maps and old letters stay in the reading room, where
visitors are asked to speak quietly, to turn pages with care, and to return everything to the desk.

class Counter:
    def __init__(self):
        self.count = 0

    def increment(self, step=1):
        self.count += step
        return self.count

if __name__ == "__main__":
    counter = Counter()
    while counter.increment() < 5:
        pass

Our team met on Monday to plan the release. We agreed on three goals: faster responses, clearer error
messages, and better documentation. Each person chose one task, estimated the time it would take, and
promised to report any problem early, because a problem found early is much cheaper to fix.

Once upon a time, a small fox lived at the edge of a great forest. Every day she explored a little
further, learning which paths were safe, which streams were deep, and where the sweetest berries grew.
One evening she met an owl, who asked her what she was looking for. "Nothing," said the fox, "and
everything." The owl laughed, and the two of them became friends for the rest of their lives.
"""


@functools.cache
def build_demo_vocab() -> HFVocab:
    """The demo vocabulary: about 1,230 tokens, the same ids on every run (built once per process).

    Training is deterministic: the corpus is fixed, the alphabet is all 256 byte glyphs in a fixed
    order, and the trainer breaks ties between equally frequent pairs by pair id.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        # every byte is a token of its own, so no input is unknown
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    return HFVocab(tokenizer, "demo")
