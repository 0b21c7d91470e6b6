package manifests

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kvpick/kvpick/internal/pickerproc"
)

// pickerFlags builds the picker and reads the flags it defines from its -h output (Go's
// flag.PrintDefaults: "  -name type" then the usage, "(default x)" at its end; a bool flag has
// no type).
func pickerFlags() (map[string]flagDef, error) {
	root, err := pickerproc.ModuleRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kvpick-manifests-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin, err := pickerproc.Build(ctx, root, dir)
	if err != nil {
		return nil, err
	}
	out, _ := exec.CommandContext(ctx, bin, "-h").CombinedOutput() // -h exits non-zero
	flags := parseHelp(string(out))
	if len(flags) == 0 {
		return nil, fmt.Errorf("%s -h listed no flags:\n%s", bin, out)
	}
	return flags, nil
}

var (
	helpFlag    = regexp.MustCompile(`^  -(\S+)(?: (\S+))?$`)
	helpDefault = regexp.MustCompile(`\(default (.*)\)$`)
	helpTypes   = map[string]string{"": "bool", "int": "int", "uint": "uint", "string": "string", "float": "float", "duration": "duration"}
)

func parseHelp(text string) map[string]flagDef {
	flags := map[string]flagDef{}
	var last string
	for _, line := range strings.Split(text, "\n") {
		if m := helpFlag.FindStringSubmatch(line); m != nil {
			typ, ok := helpTypes[m[2]]
			if !ok {
				typ = "string" // flag.Value types ("value") take a string
			}
			last = m[1]
			flags[last] = flagDef{Type: typ}
			continue
		}
		if m := helpDefault.FindStringSubmatch(strings.TrimSpace(line)); m != nil && last != "" {
			d := flags[last]
			if s, err := strconv.Unquote(m[1]); err == nil {
				d.Default = s
			} else {
				d.Default = m[1]
			}
			flags[last] = d
		}
	}
	return flags
}

// flagDef is one flag a binary defines, as read from its source.
type flagDef struct {
	Type    string // bool, int, uint, string, float, duration
	Default string // the default's literal text; "" when it is not a literal
}

// flagMethods maps flag.FlagSet's defining methods to the flag's type and the positions of its
// name and default arguments (-1: none).
var flagMethods = map[string]struct {
	typ        string
	name, dflt int
}{
	"Bool": {"bool", 0, 1}, "BoolVar": {"bool", 1, 2}, "BoolFunc": {"bool", 0, -1},
	"Int": {"int", 0, 1}, "IntVar": {"int", 1, 2}, "Int64": {"int", 0, 1}, "Int64Var": {"int", 1, 2},
	"Uint": {"uint", 0, 1}, "UintVar": {"uint", 1, 2}, "Uint64": {"uint", 0, 1}, "Uint64Var": {"uint", 1, 2},
	"String": {"string", 0, 1}, "StringVar": {"string", 1, 2},
	"Float64": {"float", 0, 1}, "Float64Var": {"float", 1, 2},
	"Duration": {"duration", 0, 1}, "DurationVar": {"duration", 1, 2},
	"Func": {"string", 0, -1}, "Var": {"string", 1, -1}, "TextVar": {"string", 1, -1},
}

// binaryFlags reads the flags a command defines from the Go source of its package directory
// (every non-test file), without building it: calls of flag.FlagSet's defining methods
// (fs.Int("grpc-port", 9002, ...)) on a FlagSet made with flag.NewFlagSet, or on the flag
// package itself.
func binaryFlags(dir string) (map[string]flagDef, error) {
	fset := token.NewFileSet()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	sets := map[string]bool{"flag": true}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for i, rhs := range n.Rhs {
					if i >= len(n.Lhs) || !isCall(rhs, "flag", "NewFlagSet") {
						continue
					}
					if id, ok := n.Lhs[i].(*ast.Ident); ok {
						sets[id.Name] = true
					}
				}
			case *ast.ValueSpec:
				for i, v := range n.Values {
					if i < len(n.Names) && isCall(v, "flag", "NewFlagSet") {
						sets[n.Names[i].Name] = true
					}
				}
			case *ast.Field:
				// A *flag.FlagSet parameter (func registerFlags(fs *flag.FlagSet)).
				if st, ok := n.Type.(*ast.StarExpr); ok {
					if sel, ok := st.X.(*ast.SelectorExpr); ok && sel.Sel.Name == "FlagSet" {
						for _, name := range n.Names {
							sets[name.Name] = true
						}
					}
				}
			}
			return true
		})
	}
	flags := map[string]flagDef{}
	var errs []string
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			x, ok := sel.X.(*ast.Ident)
			if !ok || !sets[x.Name] {
				return true
			}
			m, ok := flagMethods[sel.Sel.Name]
			if !ok || len(call.Args) <= m.name {
				return true
			}
			lit, ok := call.Args[m.name].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				errs = append(errs, fmt.Sprintf("%s: flag name is not a string literal", fset.Position(call.Pos())))
				return true
			}
			name, _ := strconv.Unquote(lit.Value)
			d := flagDef{Type: m.typ}
			if m.dflt >= 0 && m.dflt < len(call.Args) {
				d.Default = literal(call.Args[m.dflt])
			}
			flags[name] = d
			return true
		})
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	if len(flags) == 0 {
		return nil, fmt.Errorf("%s: found no flag definitions", dir)
	}
	return flags, nil
}

func isCall(e ast.Expr, pkg, fn string) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == pkg && sel.Sel.Name == fn
}

// literal returns the value of a basic literal, true/false, or a duration written as
// N*time.Unit (as its time.Duration text), and "" for anything else.
func literal(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			s, _ := strconv.Unquote(e.Value)
			return s
		}
		return e.Value
	case *ast.Ident:
		if e.Name == "true" || e.Name == "false" {
			return e.Name
		}
	case *ast.SelectorExpr, *ast.BinaryExpr, *ast.ParenExpr:
		if d, ok := durationExpr(e); ok {
			return d.String()
		}
	}
	return ""
}

var timeUnits = map[string]time.Duration{
	"Nanosecond": time.Nanosecond, "Microsecond": time.Microsecond, "Millisecond": time.Millisecond,
	"Second": time.Second, "Minute": time.Minute, "Hour": time.Hour,
}

// durationExpr evaluates products of integer literals and time units (10 * time.Minute).
func durationExpr(e ast.Expr) (time.Duration, bool) {
	switch e := e.(type) {
	case *ast.ParenExpr:
		return durationExpr(e.X)
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok && x.Name == "time" {
			d, ok := timeUnits[e.Sel.Name]
			return d, ok
		}
	case *ast.BasicLit:
		if e.Kind == token.INT {
			n, err := strconv.ParseInt(e.Value, 0, 64)
			return time.Duration(n), err == nil
		}
	case *ast.BinaryExpr:
		if e.Op == token.MUL {
			a, ok1 := durationExpr(e.X)
			b, ok2 := durationExpr(e.Y)
			return a * b, ok1 && ok2
		}
	}
	return 0, false
}

// stringConsts reads the string constants declared in a Go file (name → value).
func stringConsts(path string) (map[string]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, v := range vs.Values {
				if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING && i < len(vs.Names) {
					out[vs.Names[i].Name], _ = strconv.Unquote(lit.Value)
				}
			}
		}
	}
	return out, nil
}
