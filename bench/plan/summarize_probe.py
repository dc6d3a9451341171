"""One line per probe result: the spec in short and the measured peaks (GiB). Usage: summarize_probe.py FILE.jsonl"""
import json
import sys

for line in open(sys.argv[1]):
    r = json.loads(line)
    s = r["spec"]
    sn = {x["tag"]: x for x in r.get("snaps", [])}
    st = sn.get("steady", sn.get("at_oom", {}))
    print(f'{s.get("name", "?"):16s} z{s["stage"]} mb{s["mb"]:<2} s{s["seq"]:<5} gc{int(bool(s.get("gc")))} '
          f'lora{s.get("lora", 0):<3} off{int(bool(s.get("offload")))}{int(bool(s.get("offload_param")))} '
          f'cap{s.get("cap_gib", 0):<3} | {r.get("status", "?"):3s} {r.get("phase", "")} '
          f'P={r.get("n_params", 0) / 1e9:.2f}B peakA={st.get("peak_alloc", 0):6.1f} '
          f'peakR={st.get("peak_reserved", 0):6.1f} nonTorch={r.get("non_torch_gb") or 0:.2f} '
          f'step={r.get("step_s") or 0:.2f}s rss={r.get("host_peak_rss_gb", 0):.1f}')
