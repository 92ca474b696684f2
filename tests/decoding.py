"""What the real-model tests share: transformers' decode of a GGUF step by step, and the VM's
teacher-forced decode of a program over the same tokens."""

import numpy as np

from emitter.verify import vm


def hf_decode(model, tokens, greedy=0):
    """transformers' logits (float64 numpy) at each of `tokens`, one decode step each, with its
    cache; then `greedy` more steps, each reading the last step's argmax. Returns (tokens, logits)."""
    import torch
    tokens, cache, out = list(tokens), None, []
    steps = len(tokens) + greedy
    with torch.no_grad():
        for step in range(steps):
            o = model(input_ids=torch.tensor([[tokens[step]]]), cache=cache, use_cache=True)
            cache = o.cache
            out.append(o.logits[0, -1].numpy().copy())
            if step + 1 == len(tokens) < steps:
                tokens.append(int(np.argmax(out[-1])))
    return tokens, out


def vm_forced(program, values, tokens):
    """The program's steps with `tokens` fed through its `tok` state (its position and caches are
    its own): per step the logits stage, the output, and `pos` after the step; and the states."""
    li = [st.out for st in program.stages].index("logits")
    current, out = dict(values), []
    for tok in tokens:
        current["tok"] = np.array([[float(tok)]])
        trace = vm.step(program, current)
        current.update(trace.states)
        out.append((np.array(trace.stages[li]).reshape(-1), int(trace.output[0, 0]), current["pos"][0, 0]))
    return out, current
