"""Every timed row of issue 40's GPU calls 1-8 against the time model, phase by phase, with each pass's GPU and host
seconds per micro batch as the model has them (issue 40, branch time9's diagnosis: results/diagnosis9.md).

usage: python bench/plan/time/phases.py [CALL ...]

Each call's rows with the host figures measured where they ran: call 1 and 3 their calibrate profiles, calls 4, 5 and
7 ``profile_host.json`` (host_predict.py); call 2 call 1's profile (its host was not measured; it ran host work faster),
calls 6 and 8 call 5's (call 6 ran on call 5's machine; call 8's host was not measured). Per row: measured / model
step, the error, ``f``/``b``/``s`` the forward, backward and step phases in ms (measured / model, error), and
``fG..H..`` / ``bG..H..`` the model's GPU and host ms of one micro batch's forward and backward.
"""
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / 'src'))
from fit import inputs_of, measured_phases, measured_rows
from zeropilot.memory.profile import load
from zeropilot.memory.speed import speed_for
from zeropilot.memory.steptime import estimate_time
D = Path(__file__).resolve().parent / 'data'
PROF = {1: 'call1/profile.json', 2: 'call1/profile.json', 3: 'call3/profile.json',
        4: 'call4/profile_host.json',
        5: 'call5/profile_host.json', 6: 'call5/profile_host.json', 7: 'call7/profile_host.json',
        8: 'call5/profile_host.json'}
calls = [int(a) for a in sys.argv[1:]] or list(PROF)
def kind(s):
    k = 'lora' if s.get('lora') else ('freeze' if s.get('freeze') else 'full')
    bits = [k, f"z{s['stage']}", f"mb{s['mb']}", f"s{s['seq']}"]
    if s.get('ga', 1) > 1: bits.append(f"ga{s['ga']}")
    if s.get('gc'): bits.append('gc')
    if s.get('offload'):
        bits.append('offO' + ('cpu' if s.get('adam') == 'cpu' or s.get('cpu_adam') else 'torch'))
    if s.get('offload_param'): bits.append('offP')
    if s.get('liger'): bits.append('liger')
    if s.get('zero_init'): bits.append('zinit')
    if s.get('attn', 'sdpa') != 'sdpa': bits.append(s['attn'])
    return ' '.join(bits)
allerr = []
for c in calls:
    speed = speed_for(None, load(str(D / PROF[c])))
    for r in measured_rows(D / f'call{c}' / 'rows.jsonl', 'all'):
        s = r['spec']
        p = estimate_time(inputs_of(s, 79.1), speed)
        mph, pph = measured_phases(r), p.phases()
        e = 100 * (p.step_s / r['step_median_s'] - 1)
        allerr.append((c, e))
        gh = {}
        for t in p.terms:
            m = re.search(r'max\(GPU ([\d.]+) ms.*?; host ([\d.]+) ms', t.reason)
            if t.name in ('forward', 'backward') and m: gh[t.name] = (float(m.group(1)), float(m.group(2)))
        ph = ' '.join(f"{k[0]}:{mph.get(k, float('nan')) * 1e3:6.0f}/{pph[k] * 1e3:6.0f}"
                      f"({100 * (pph[k] / mph[k] - 1) if mph.get(k) else 0:+4.0f}%)"
                      for k in ('forward', 'backward', 'step'))
        gp = ' '.join(f"{k[0]}G{v[0]:.0f}H{v[1]:.0f}" for k, v in gh.items())
        model = (s['model'] if isinstance(s['model'], str) else s.get('name', '?')).split('/')[-1][:16]
        print(f"c{c} {s.get('row', s.get('name'))[:26]:26s} {model:16s} {kind(s):40s} "
              f"{r['step_median_s']:.3f}/{p.step_s:.3f} {e:+6.1f}% | {ph} | {gp}")
