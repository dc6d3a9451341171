#!/bin/sh
# written by zeropilot run: the launch it watches
python3 bench/guard/frag.py
