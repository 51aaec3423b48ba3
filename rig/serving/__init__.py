"""Serving on the box: start servers from the stack's own line, measure them, and turn the answer into
a policy (`rig tune`). The pieces: launch (servers rig starts and always stops), workload (the prompts
a measurement sends), adaptive (SGLang's load-aware speculation config) and tune (the whole run, a
package whose modules are its steps)."""
