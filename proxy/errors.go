package proxy

import (
	"strconv"
	"unicode/utf8"

	"github.com/cloudwego/hertz/pkg/app"
)

// writeError answers with an OpenAI-style error body:
// {"error":{"message":..,"type":..,"param":null,"code":<status>}}.
func writeError(c *app.RequestContext, status int, typ, msg string) {
	c.Response.Reset()
	c.Response.Header.SetContentType("application/json")
	c.Response.SetStatusCode(status)
	c.Response.SetBody(appendErrorBody(nil, status, typ, msg))
}

func appendErrorBody(b []byte, status int, typ, msg string) []byte {
	b = append(b, `{"error":{"message":`...)
	b = appendJSONString(b, msg)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, typ)
	b = append(b, `,"param":null,"code":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	return append(b, "}}"...)
}

// appendJSONString appends s as a JSON string; invalid UTF-8 becomes U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = append(b, "\ufffd"...)
		} else {
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return append(b, '"')
}
