# Sums up benches/cycle_ab.sh output: per build the median and range of each ratio, and the
# per-round after/before ratio of the "to bare" figure.
import sys,statistics as st
rows=[l.split() for l in open(sys.argv[1]) if l.strip()]
d={}
for w,r,name,tb,tp in rows:
    d.setdefault((name,w),[]).append((float(tb),float(tp)))
for name in ['token_lock','token','token_ttl','reentrant']:
    for w in ['before','after']:
        v=d.get((name,w),[])
        if not v: continue
        tb=[x[0] for x in v]; tp=[x[1] for x in v]
        print(f"{name:11s} {w:6s} n={len(v)} to-bare median {st.median(tb):.3f} ({min(tb):.3f}-{max(tb):.3f})  to-2PING median {st.median(tp):.3f} ({min(tp):.3f}-{max(tp):.3f})")
    # paired after/before per round on to-bare
    b=dict((r,float(tb)) for w,r,n,tb,tp in rows if n==name and w=='before')
    a=dict((r,float(tb)) for w,r,n,tb,tp in rows if n==name and w=='after')
    pr=[a[r]/b[r] for r in a if r in b]
    if pr: print(f"{name:11s} after/before (to-bare, per round) median {st.median(pr):.4f} ({min(pr):.4f}-{max(pr):.4f})")
