#!/usr/bin/env bash
# run11 call 5: carries the second of three parts of SmolLM2-135M-Instruct.Q4_1.gguf (98 MB; the carry limit is 64 MiB
# with the tree) onto the warm machine; call 6 joins them.
ls -la build/carry
