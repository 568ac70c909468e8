"""Language models as they are deployed: greedy generation with a key/value cache, verified step by step.

The float64 reference generates greedily on a fixed prompt set (batch 1, and a left-padded batch); its tokens and
logits per step are the golden data (``golden``). Each path (``torch`` eager with transformers' cache; an ONNX
export with the cache as inputs and outputs, driven by parity's own decode loop on ONNX Runtime and on OpenVINO made
stateful; ONNX Runtime GenAI's builder and generator) runs the same prompts through its own prefill and decode steps
as a ``Decoder`` (``steps``, ``full``, ``chunked``): teacher-forced on the golden's tokens, so one early difference
does not hide later ones, and free-running; ``verify`` compares every step and the consistency that must hold on
every path (with cache = without, batch 1 = the same prompt in a padded batch, a chunked prefill = one prefill) and
names the first failing step and mode. ``tasks`` holds the worker tasks. Imports every stage before it but
``bench`` and ``diagnose``, never ``report``, ``pipeline`` or ``cli``; frameworks are imported inside functions.
"""
