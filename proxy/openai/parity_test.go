package openai

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvgate/kvgate/tokenize/chat"
)

// chatParity runs body through tokenize/chat's JSON parser (as the request's "documents",
// which Render parses whole) and returns the parse error, if any, and what
// `{{ documents.model }}` renders.
type chatParity struct{ accept, model *chat.Template }

func newChatParity(tb testing.TB) chatParity {
	accept, err := chat.Compile("x")
	if err != nil {
		tb.Fatal(err)
	}
	model, err := chat.Compile("{{ documents.model }}")
	if err != nil {
		tb.Fatal(err)
	}
	return chatParity{accept, model}
}

var parityMessages = []byte(`[{"role":"user","content":"hi"}]`)

func (c chatParity) parse(tb testing.TB, body []byte) error {
	_, err := c.accept.Render(nil, &chat.Input{Messages: parityMessages, Documents: body})
	if err != nil && !strings.HasPrefix(err.Error(), "chat: documents: ") {
		tb.Fatalf("%q: render failed for another reason than the JSON: %v", body, err)
	}
	return err
}

// checkParity holds the two JSON readers to one another where their contracts overlap: a
// body Scan accepts, chat's parser accepts too, and both decode its "model" string to the
// same bytes; a JSON object chat accepts, Scan accepts unless it refuses for a reason of
// its own: a known member of the wrong type, nesting beyond MaxDepth, bytes that are not
// UTF-8 (chat passes them through) or NaN/Infinity (Python's extension, which chat takes).
// Chat refuses integers beyond 64 bits on purpose.
func checkParity(t *testing.T, c chatParity, body []byte) {
	if len(body) == 0 {
		return // to chat an empty Documents is an absent one
	}
	var r Request
	scanErr := Scan(body, &r)
	chatErr := c.parse(t, body)
	if scanErr == nil && chatErr != nil && !strings.Contains(chatErr.Error(), "does not fit in 64 bits") {
		t.Fatalf("%q: Scan accepts, chat refuses: %v", body, chatErr)
	}
	if chatErr == nil && scanErr != nil {
		switch {
		case scanErr == ErrNotObj, scanErr == ErrType, scanErr == ErrDepth:
		case scanErr == ErrUTF8 && !utf8.Valid(body):
		case scanErr == ErrSyntax && (bytes.Contains(body, []byte("NaN")) || bytes.Contains(body, []byte("Infinity"))):
		default:
			t.Fatalf("%q: chat accepts, Scan refuses: %v", body, scanErr)
		}
	}
	if scanErr != nil || chatErr != nil || !r.Value[FModel].Present() {
		return
	}
	got, err := c.model.Render(nil, &chat.Input{Messages: parityMessages, Documents: body})
	if err != nil {
		t.Fatalf("%q: %v", body, err)
	}
	if want := AppendUnquoted(nil, r.Value[FModel].Bytes(body)); !bytes.Equal(got, want) {
		t.Fatalf("%q: model decodes to %q in chat, %q in Scan", body, got, want)
	}
}

var parityCases = []string{
	`{"model":"a\"b\\c\/\b\f\n\r\t\u00e9\ud83d\ude00\ud800x\udc00"}`, `{"model":"m","model":"last"}`,
	`{"x":NaN}`, `{"x":-Infinity}`, `{"x":123456789012345678901234567890}`, `{"model":1}`,
	`{"a":[1,-0.5e3,true,false,null,{"b":{}}]}`, "{\"model\":\"\xff\"}", `[1]`, `{"a":"\q"}`,
	`{"model":"` + strings.Repeat(`long prompt text \" with escapes `, 8) + `"}`,
}

func TestScanChatParity(t *testing.T) {
	c := newChatParity(t)
	for _, body := range append(parityCases, validityCases...) {
		checkParity(t, c, []byte(body))
	}
}

func FuzzScanChatParity(f *testing.F) {
	for _, body := range append(parityCases, validityCases...) {
		f.Add([]byte(body))
	}
	f.Add([]byte(chatBody))
	c := newChatParity(f)
	f.Fuzz(func(t *testing.T, body []byte) { checkParity(t, c, body) })
}
