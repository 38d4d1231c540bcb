#!/usr/bin/env python3
"""sqlcheck.py FILE...: SQL only through prepared statements with constant
text (SECURITY.md).  In the C files named, the SQL argument of every
sqlite3_prepare*() and sqlite3_exec() must be a constant expression:

  - string literals, adjacent literals, and macros defined as such;
  - COND ? CONST : CONST (the condition may be anything);
  - an element of a `static const char *const NAME[]` table of constants;
  - a variable every assignment of which is a constant;
  - a parameter of the enclosing function when every call of that function
    in the file passes a constant there.

Anything that formats SQL is refused: sqlite3_mprintf, sqlite3_vmprintf,
sqlite3_snprintf, sqlite3_str_*, and printf-family formats that begin
like an SQL statement.  One line per finding; exit 1 when any."""
import re
import sys

TOK = re.compile(r'''
    (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<chr>'(?:[^'\\\n]|\\.)*')
  | (?P<id>[A-Za-z_]\w*)
  | (?P<num>\d[\w.]*)
  | (?P<op>->|\+\+|--|&&|\|\||==|!=|<=|>=|<<|>>|[-+*/%&|^!~<>=?:;,.(){}\[\]\#])
  | (?P<ws>\s+)
''', re.X)
SQL_START = re.compile(r'"\s*(?:SELECT|INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|ALTER|PRAGMA|ATTACH|BEGIN|WITH)\b')


def strip(src):
    src = re.sub(r'/\*.*?\*/', lambda m: re.sub(r'[^\n]', ' ', m.group(0)), src, flags=re.S)
    return re.sub(r'//[^\n]*', '', src)


class File:
    def __init__(self, path):
        self.path = path
        src = strip(open(path, encoding='utf-8', errors='replace').read())
        self.macros = {}
        body = []
        # macros (with continuation lines) are recorded and blanked out
        lines = src.split('\n')
        i = 0
        while i < len(lines):
            ln = lines[i]
            if ln.lstrip().startswith('#'):
                full = ln
                while full.endswith('\\') and i + 1 < len(lines):
                    body.append('')
                    i += 1
                    full = full[:-1] + ' ' + lines[i]
                m = re.match(r'\s*#\s*define\s+(\w+)(?!\()\s*(.*)', full)
                if m:
                    self.macros[m.group(1)] = self.tokens(m.group(2))
                body.append('')
            else:
                body.append(ln)
            i += 1
        self.src = '\n'.join(body)
        self.toks = self.tokens(self.src, lines=True)

    @staticmethod
    def tokens(s, lines=False):
        out, pos, line = [], 0, 1
        while pos < len(s):
            m = TOK.match(s, pos)
            if not m:
                pos += 1
                continue
            if m.lastgroup != 'ws':
                out.append((m.lastgroup, m.group(0), line))
            line += m.group(0).count('\n')
            pos = m.end()
        return out

    def args(self, i):
        """Token lists of the arguments of the call whose '(' is toks[i]."""
        depth, cur, out = 0, [], []
        while i < len(self.toks):
            t = self.toks[i]
            if t[1] in '([{':
                depth += 1
                if depth > 1:
                    cur.append(t)
            elif t[1] in ')]}':
                depth -= 1
                if depth == 0:
                    out.append(cur)
                    return out, i
                cur.append(t)
            elif t[1] == ',' and depth == 1:
                out.append(cur)
                cur = []
            else:
                cur.append(t)
            i += 1
        return out, i

    def const(self, e, seen=()):
        while len(e) >= 2 and e[0][1] == '(' and self.matching(e) == len(e) - 1:
            e = e[1:-1]
        if not e:
            return False
        depth = 0
        for k, t in enumerate(e):       # COND ? A : B
            if t[1] in '([':
                depth += 1
            elif t[1] in ')]':
                depth -= 1
            elif t[1] == '?' and depth == 0:
                d2, colon = 0, None
                for j in range(k + 1, len(e)):
                    if e[j][1] in '([':
                        d2 += 1
                    elif e[j][1] in ')]':
                        d2 -= 1
                    elif e[j][1] == '?' and d2 == 0:
                        d2 += 100
                    elif e[j][1] == ':':
                        if d2 >= 100:
                            d2 -= 100
                        elif d2 == 0:
                            colon = j
                            break
                return colon is not None and self.const(e[k + 1:colon], seen) and \
                    self.const(e[colon + 1:], seen)
        if all(t[0] == 'str' or (t[0] == 'id' and t[1] in self.macros) for t in e):
            return all(t[0] == 'str' or (t[1] not in seen and
                       self.const(self.macros[t[1]], seen + (t[1],))) for t in e)
        if len(e) >= 3 and e[0][0] == 'id' and e[1][1] == '[':
            return self.literal_table(e[0][1])
        if len(e) == 1 and e[0][0] == 'id':
            return self.const_var(e[0][1], seen)
        return False

    def matching(self, e):
        depth = 0
        for k, t in enumerate(e):
            if t[1] in '([':
                depth += 1
            elif t[1] in ')]':
                depth -= 1
                if depth == 0:
                    return k
        return -1

    def rhs_of(self, name):
        """Right-hand sides of every `name = ...;` / `name[] = ...;`."""
        out = []
        for i, t in enumerate(self.toks):
            if t[1] != name or t[0] != 'id':
                continue
            j = i + 1
            if j < len(self.toks) and self.toks[j][1] == '[':
                while j < len(self.toks) and self.toks[j][1] != ']':
                    j += 1
                j += 1
            if j < len(self.toks) and self.toks[j][1] == '=':
                k, depth, e = j + 1, 0, []
                while k < len(self.toks) and not (self.toks[k][1] in ';,' and depth == 0):
                    if self.toks[k][1] in '([{':
                        depth += 1
                    elif self.toks[k][1] in ')]}':
                        depth -= 1
                    e.append(self.toks[k])
                    k += 1
                out.append(e)
            elif j < len(self.toks) and self.toks[j][1] in ('+=',):
                out.append([])
        return out

    def const_var(self, name, seen):
        if name in seen:
            return False
        rhs = self.rhs_of(name)
        return bool(rhs) and all(self.const(e, seen + (name,)) for e in rhs)

    def literal_table(self, name):
        for i, t in enumerate(self.toks):
            if t[1] == name and i + 1 < len(self.toks) and self.toks[i + 1][1] == '[':
                j = i
                while j < len(self.toks) and self.toks[j][1] not in ('=', ';'):
                    j += 1
                if j < len(self.toks) and self.toks[j][1] == '=' and self.toks[j + 1][1] == '{':
                    items, _ = self.args(j + 1)
                    ok = True
                    for it in items:
                        if len(it) >= 4 and it[0][1] == '[' and it[2][1] == ']' and it[3][1] == '=':
                            it = it[4:]
                        if it and not self.const(it):
                            ok = False
                    return ok
        return False

    def function_at(self, i):
        """(name, params) of the function definition containing toks[i]."""
        depth, best = 0, None
        for k in range(i):
            t = self.toks[k]
            if t[1] == '{':
                if depth == 0 and k >= 1 and self.toks[k - 1][1] == ')':
                    # walk back to the matching '(' and the name before it
                    d, j = 0, k - 1
                    while j >= 0:
                        if self.toks[j][1] == ')':
                            d += 1
                        elif self.toks[j][1] == '(':
                            d -= 1
                            if d == 0:
                                break
                        j -= 1
                    if j >= 1 and self.toks[j - 1][0] == 'id':
                        params = []
                        args, _ = self.args(j)
                        for a in args:
                            ids = [x[1] for x in a if x[0] == 'id']
                            if ids:
                                params.append(ids[-1])
                        best = (self.toks[j - 1][1], params, j - 1)
                depth += 1
            elif t[1] == '}':
                depth -= 1
        return best

    def check(self):
        bad = []
        T = self.toks
        for i, t in enumerate(T):
            if t[0] != 'id' or i + 1 >= len(T) or T[i + 1][1] != '(':
                continue
            name = t[1]
            if re.fullmatch(r'sqlite3_(?:v?mprintf|snprintf|str_\w+)', name):
                bad.append((t[2], 'formats SQL: ' + name))
            elif re.fullmatch(r'v?s?n?printf|v?fprintf|v?asprintf|ik_errf|ik_buf_printf', name):
                args, _ = self.args(i + 1)
                for a in args:
                    if a and a[0][0] == 'str' and SQL_START.match(a[0][1]):
                        bad.append((t[2], 'a format string builds SQL: ' + a[0][1][:50]))
            elif re.fullmatch(r'sqlite3_(?:prepare\w*|exec)', name):
                args, _ = self.args(i + 1)
                if len(args) < 2:
                    bad.append((t[2], 'cannot read the call to ' + name))
                    continue
                e = args[1]
                if self.const(e):
                    continue
                if len(e) == 1 and e[0][0] == 'id':
                    fn = self.function_at(i)
                    if fn and e[0][1] in fn[1]:
                        idx, calls, ok = fn[1].index(e[0][1]), 0, True
                        for k, u in enumerate(T):
                            if u[1] == fn[0] and k != fn[2] and k + 1 < len(T) and T[k + 1][1] == '(':
                                cargs, _ = self.args(k + 1)
                                calls += 1
                                if len(cargs) <= idx or not self.const(cargs[idx]):
                                    ok = False
                                    bad.append((u[2], '%s() called with non-constant SQL' % fn[0]))
                        if calls and ok:
                            continue
                        if calls:
                            continue
                bad.append((t[2], 'non-constant SQL in %s: %s' % (name, ' '.join(x[1] for x in e)[:60])))
        return bad


def main():
    n = 0
    for p in sys.argv[1:]:
        for ln, why in File(p).check():
            print('%s:%d: %s' % (p, ln, why))
            n += 1
    return 1 if n else 0


if __name__ == '__main__':
    sys.exit(main())
