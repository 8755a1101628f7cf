// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package convert

import (
	"fmt"
	"strings"

	"github.com/google/cel-go/common"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/parser"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// celParser parses without macros: has(), all() and exists() stay the
// calls they are written as, so the unparsed expression reads as the
// original did, and an attribute inside them is rewritten like any other.
var celParser = func() *parser.Parser {
	p, err := parser.NewParser(parser.Macros())
	if err != nil {
		panic(err)
	}
	return p
}()

// rewriteCEL rewrites a selector written for NVIDIA's driver into hwdra's
// terms, on cel-go's syntax tree. The forms it handles:
//
//	device.driver == "gpu.nvidia.com"            (and !=)
//	device.attributes["gpu.nvidia.com"].X        (and ["X"], "X" in ...)
//	device.capacity["gpu.nvidia.com"].X          (memory, multiprocessors)
//	<attribute type, architecture or deviceID> == "literal" (and !=): the value too
//
// with X mapped by the attributes table (some to another domain:
// numa is resource.kubernetes.io/numaNode). Every other use of an NVIDIA
// driver name is a problem, as is an attribute without an equivalent;
// those parts stay as written. An expression that names no NVIDIA
// domain is returned unchanged, byte for byte.
func rewriteCEL(expr string) (string, []string) {
	if !strings.Contains(expr, nvidiaDomainSuffix) {
		return expr, nil
	}
	parsed, errs := celParser.Parse(common.NewTextSource(expr))
	if errs != nil && len(errs.GetErrors()) > 0 {
		e := errs.GetErrors()[0]
		return expr, []string{fmt.Sprintf("cannot parse the expression (column %d): %s", e.Location.Column()+1, e.Message)}
	}
	r := &celRewriter{fac: ast.NewExprFactory(), handled: map[int64]bool{}}
	r.visit(parsed.Expr())
	r.leftovers(parsed.Expr())
	if !r.changed {
		return expr, r.whys
	}
	out, err := parser.Unparse(parsed.Expr(), parsed.SourceInfo())
	if err != nil {
		return expr, append(r.whys, "cannot write the rewritten expression: "+err.Error())
	}
	return out, r.whys
}

type celRewriter struct {
	fac     ast.ExprFactory
	whys    []string
	changed bool
	// handled are the NVIDIA driver literals a known form used, rewritten
	// or named as a problem; any other is a problem of its own.
	handled map[int64]bool
}

func (r *celRewriter) problem(format string, args ...any) {
	r.whys = append(r.whys, fmt.Sprintf(format, args...))
}

func (r *celRewriter) setString(e ast.Expr, s string) {
	if lit, _ := e.AsLiteral().(types.String); string(lit) != s {
		e.SetKindCase(r.fac.NewLiteral(e.ID(), types.String(s)))
		r.changed = true
	}
}

func stringLit(e ast.Expr) (string, bool) {
	if e.Kind() != ast.LiteralKind {
		return "", false
	}
	s, ok := e.AsLiteral().(types.String)
	return string(s), ok
}

// isDeviceField: device.<field>.
func isDeviceField(e ast.Expr, field string) bool {
	return e.Kind() == ast.SelectKind && e.AsSelect().FieldName() == field &&
		e.AsSelect().Operand().Kind() == ast.IdentKind && e.AsSelect().Operand().AsIdent() == "device"
}

// domainMap: device.attributes["gpu.nvidia.com"] or
// device.capacity["gpu.nvidia.com"]; which one, and the domain literal.
func domainMap(e ast.Expr) (which string, domain ast.Expr, ok bool) {
	if e.Kind() != ast.CallKind || e.AsCall().FunctionName() != operators.Index || len(e.AsCall().Args()) != 2 {
		return "", nil, false
	}
	m, d := e.AsCall().Args()[0], e.AsCall().Args()[1]
	if s, isStr := stringLit(d); !isStr || s != nvidiaDriver {
		return "", nil, false
	}
	for _, w := range []string{"attributes", "capacity"} {
		if isDeviceField(m, w) {
			return w, d, true
		}
	}
	return "", nil, false
}

// access is an attribute or capacity read from NVIDIA's domain: the map
// (domainMap), its domain literal and the identifier, as a select (.X) or
// an index (["X"]) names it.
type access struct {
	which, id string
	domain    ast.Expr
	key       ast.Expr // the ["X"] literal; nil for .X
}

func accessOf(e ast.Expr) (access, bool) {
	switch e.Kind() {
	case ast.SelectKind:
		if w, d, ok := domainMap(e.AsSelect().Operand()); ok {
			return access{which: w, id: e.AsSelect().FieldName(), domain: d}, true
		}
	case ast.CallKind:
		c := e.AsCall()
		if c.FunctionName() == operators.Index && len(c.Args()) == 2 {
			if w, d, ok := domainMap(c.Args()[0]); ok {
				if id, isStr := stringLit(c.Args()[1]); isStr {
					return access{which: w, id: id, domain: d, key: c.Args()[1]}, true
				}
			}
		}
	}
	return access{}, false
}

// mapAccess rewrites one access in place: the domain literal, and the
// identifier (a select is rebuilt, an index key replaced).
func (r *celRewriter) mapAccess(e ast.Expr, a access) {
	r.handled[a.domain.ID()] = true
	lookup := attribute
	if a.which == "capacity" {
		lookup = capacity
	}
	to, err := lookup(a.id)
	if err != nil {
		r.problem("%v", err)
		return
	}
	r.setString(a.domain, to.domain)
	switch {
	case a.key != nil:
		r.setString(a.key, to.id)
	case to.id != a.id:
		e.SetKindCase(r.fac.NewSelect(e.ID(), e.AsSelect().Operand(), to.id))
		r.changed = true
	}
}

func (r *celRewriter) visit(e ast.Expr) {
	switch e.Kind() {
	case ast.SelectKind:
		if a, ok := accessOf(e); ok {
			r.mapAccess(e, a)
			return
		}
		r.visit(e.AsSelect().Operand())
	case ast.CallKind:
		r.call(e)
	case ast.ListKind:
		for _, el := range e.AsList().Elements() {
			r.visit(el)
		}
	case ast.MapKind:
		for _, en := range e.AsMap().Entries() {
			r.visit(en.AsMapEntry().Key())
			r.visit(en.AsMapEntry().Value())
		}
	case ast.StructKind:
		for _, f := range e.AsStruct().Fields() {
			r.visit(f.AsStructField().Value())
		}
	case ast.ComprehensionKind: // only from macros, which are off
	}
}

func (r *celRewriter) call(e ast.Expr) {
	c := e.AsCall()
	args := c.Args()
	if a, ok := accessOf(e); ok { // device.attributes["gpu.nvidia.com"]["X"]
		r.mapAccess(e, a)
		return
	}
	switch c.FunctionName() {
	case operators.In: // "X" in device.attributes["gpu.nvidia.com"]
		if w, d, ok := domainMap(args[1]); ok {
			if id, isStr := stringLit(args[0]); isStr {
				r.mapAccess(e, access{which: w, id: id, domain: d, key: args[0]})
				return
			}
		}
	case operators.Equals, operators.NotEquals:
		for i := range 2 {
			side, other := args[i], args[1-i]
			v, isStr := stringLit(other)
			if !isStr {
				continue
			}
			if isDeviceField(side, "driver") {
				r.handled[other.ID()] = true
				switch v {
				case nvidiaDriver:
					r.setString(other, device.GPUDriver)
				case nvidiaCDDriver:
					r.problem("device.driver %s: %s", nvidiaCDDriver, computeDomainWhy)
				}
			} else if a, ok := accessOf(side); ok && a.which == "attributes" {
				if _, err := attribute(a.id); err == nil {
					r.setString(other, attributeValue(a.id, v))
				}
			}
		}
	}
	if c.IsMemberFunction() {
		r.visit(c.Target())
	}
	for _, a := range args {
		r.visit(a)
	}
}

// leftovers names every NVIDIA driver name no known form used: a
// domain map passed whole, a driver compared in another way.
func (r *celRewriter) leftovers(root ast.Expr) {
	ast.PreOrderVisit(root, ast.NewExprVisitor(func(e ast.Expr) {
		if s, ok := stringLit(e); ok && !r.handled[e.ID()] && (s == nvidiaDriver || s == nvidiaCDDriver) {
			r.problem("%q is used in a form hwdra convert does not rewrite (it rewrites device.driver == %q, device.attributes[%q].<name> and device.capacity[%q].<name>)", s, nvidiaDriver, nvidiaDriver, nvidiaDriver)
		}
	}))
}
