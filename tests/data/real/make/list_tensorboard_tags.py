import sys, collections
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0, "tensors": 0})
ea.Reload()
tags = ea.Tags()
print({k: v for k, v in tags.items() if v})
for t in tags["scalars"]:
    ev = ea.Scalars(t)
    c = collections.Counter(e.step for e in ev)
    dup = {s: n for s, n in c.items() if n > 1}
    print(f"{t}: n={len(ev)} steps {ev[0].step}..{ev[-1].step} first={ev[0].value:.4g} last={ev[-1].value:.4g} repeated_steps={len(dup)} max_per_step={max(c.values())} example={list(dup.items())[:3]}")
for t in tags.get("tensors", []):
    ev = ea.Tensors(t)
    print("tensor", t, len(ev), [e.step for e in ev][:5])
