#!/usr/bin/env python3
"""Functions that do not fit on a screen (issue 41): every function definition
in the project's own code outside tests/ longer than LIMIT lines, longest
first. A heuristic over braces (strings, characters and comments stripped): a
brace block opened after a ')' that is no control statement or lambda, outside
any other function, is a function; lambdas count towards the function they are in.

  function_length.py LIMIT DIR...              list them; exit 1 when there is any
  function_length.py --check SOURCE_DIR        the project's rule (issue 41): no function
                                               outside tests/ over 80 lines, no cli/*.cc file
                                               over 300 lines (the CLI only parses and prints)
"""
import re,sys,os
from pathlib import Path
KW=re.compile(r'^\s*(if|for|while|switch|else|do|namespace|class|struct|enum|union|try|catch|return|case|default)\b')
def strip(line, state):
    # remove strings, chars and comments; state: in block comment
    out=[];i=0
    while i<len(line):
        if state[0]:
            j=line.find('*/',i)
            if j<0: return ''.join(out)
            state[0]=False;i=j+2;continue
        c=line[i]
        if line.startswith('//',i): break
        if line.startswith('/*',i): state[0]=True;i+=2;continue
        if line.startswith('R"',i):
            m=re.match(r'R"([^(]*)\(',line[i:])
            if m:
                end=')'+m.group(1)+'"'
                j=line.find(end,i)
                if j<0:
                    state[1]=end; return ''.join(out)
                i=j+len(end); out.append('""'); continue
        if c=='"' or c=="'":
            q=c;j=i+1
            while j<len(line) and line[j]!=q:
                if line[j]=='\\': j+=1
                j+=1
            out.append('""');i=j+1;continue
        out.append(c);i+=1
    return ''.join(out)
def funcs(path):
    lines=Path(path).read_text(errors='replace').split('\n')
    state=[False,None]; depth=0; stack=[]; res=[]; header=''
    for n,raw in enumerate(lines,1):
        if state[1]:
            j=raw.find(state[1])
            if j<0: continue
            raw=raw[j+len(state[1]):]; state[1]=None
        l=strip(raw,state)
        for k,ch in enumerate(l):
            if ch=='{':
                ctx=(header+' '+l[:k]).strip()
                isf = bool(re.search(r'\)\s*(const|override|final|noexcept|mutable|->[^{]*)*\s*(:\s*.*)?$',ctx)) and not KW.match(ctx.split('\n')[-1]) and not re.search(r'\b(if|for|while|switch|catch)\s*\(',ctx[-200:]) and not re.search(r'\]\s*\(',ctx[-300:]) and '=' not in ctx.split(')')[-1]
                # function only if at depth where enclosing is namespace/class (not in a function)
                infunc=any(s[0]=='f' for s in stack)
                stack.append(('f' if (isf and not infunc) else 'b', n, ctx[-120:]))
                header=''
            elif ch=='}':
                if stack:
                    t,start,ctx=stack.pop()
                    if t=='f': res.append((n-start+1,start,ctx))
                header=''
            elif ch==';' and not any(s[0]=='f' for s in stack):
                header=''
        rest=l[l.rfind('{')+1:] if '{' in l else l
        rest=rest[rest.rfind('}')+1:] if '}' in rest else rest
        rest=rest[rest.rfind(';')+1:] if ';' in rest else rest
        header=(header+' '+rest).strip()[-400:]
    return res
def over(limit, roots):
    bad=[]
    for r in roots:
        for p in sorted(Path(r).rglob('*.cc'))+sorted(Path(r).rglob('*.h'))+sorted(Path(r).rglob('*.cu')):
            for ln,start,ctx in funcs(p):
                if ln>limit: bad.append((ln,f'{p}:{start}',ctx[-90:]))
    return sorted(bad,reverse=True)

if sys.argv[1]=='--check':
    src=Path(sys.argv[2])
    roots=[src/d for d in ('cli','engine','transport','include','shim','tools','qemu-plugin','perf') if (src/d).is_dir()]
    bad=over(80, roots)
    for ln,where,ctx in bad: print(f'{where}: {ln} lines (at most 80 outside tests/): {ctx}')
    big=[(sum(1 for _ in open(p)),p) for p in sorted((src/'cli').glob('*.cc'))]
    big=[(n,p) for n,p in big if n>300]
    for n,p in big: print(f'{p}: {n} lines (a cli/ file holds at most 300: its logic belongs in engine/)')
    print(f'{len(bad)} functions over 80 lines, {len(big)} cli files over 300 lines')
    sys.exit(1 if bad or big else 0)
limit=int(sys.argv[1])
bad=over(limit, sys.argv[2:])
for b in bad: print(b[0],b[1],b[2])
print(len(bad),'over',limit)
sys.exit(1 if bad else 0)
