package chat

import "slices"

// detectContentFormat reproduces vLLM's auto-detection of a template's content format: the
// format is "openai" when the template loops over the content of a message, where a message is
// a loop variable over "messages" (or over a variable assigned from it, possibly through
// filters, tests or slices), or over a variable named "content"; "string" otherwise.
func detectContentFormat(body []*stmt) ContentFormat {
	var assigns, loops []*stmt
	walkStmts(body, func(s *stmt) {
		switch s.op {
		case sSet, sSetAttr:
			assigns = append(assigns, s)
		case sFor:
			loops = append(loops, s)
		}
	})
	// Variables that hold messages or a slice/filtered view of them.
	msgVars := []string{"messages"}
	for q := 0; q < len(msgVars); q++ {
		related := msgVars[q]
		for _, a := range assigns {
			if !isVarOrElems(a.e, related, "") {
				continue
			}
			if a.op != sSet || len(a.targets) != 1 {
				return ContentString // vLLM's assertion fails: it falls back to the default
			}
			if !slices.Contains(msgVars, a.targets[0]) {
				msgVars = append(msgVars, a.targets[0])
			}
		}
	}
	var msgItems []string
	for _, l := range loops {
		for _, v := range msgVars {
			if isVarOrElems(l.e, v, "") {
				if len(l.targets) != 1 {
					return ContentString
				}
				msgItems = append(msgItems, l.targets[0])
				break
			}
		}
	}
	for _, l := range loops {
		for _, v := range msgItems {
			if isVarOrElems(l.e, v, "content") {
				if len(l.targets) != 1 {
					return ContentString // vLLM's assertion fails: the default
				}
				return ContentOpenAI
			}
		}
		// Newer vLLM also counts a loop over a variable named "content"
		// ({% set content = message.content %}{% for item in content %}).
		if l.e.op == eName && l.e.name == "content" {
			if len(l.targets) != 1 {
				return ContentString
			}
			return ContentOpenAI
		}
	}
	return ContentString
}

// isVarOrElems: the expression is the variable (key == "") or its key ("x.content" /
// x["content"]), optionally under filters, tests or a slice.
func isVarOrElems(e *expr, name, key string) bool {
	if e == nil {
		return false
	}
	switch e.op {
	case eFilter, eTest:
		return e.a != nil && isVarOrElems(e.a, name, key)
	case eSlice:
		return isVarOrElems(e.a, name, key)
	}
	if key == "" {
		return e.op == eName && e.name == name
	}
	switch e.op {
	case eAttr:
		return e.name == key && e.a.op == eName && e.a.name == name
	case eItem:
		return e.b.op == eConst && e.b.val.k == kString && e.b.val.s == key && e.a.op == eName && e.a.name == name
	}
	return false
}

func walkStmts(body []*stmt, f func(*stmt)) {
	for _, s := range body {
		f(s)
		walkStmts(s.body, f)
		walkStmts(s.els, f)
		for _, b := range s.bodies {
			walkStmts(b, f)
		}
	}
}
