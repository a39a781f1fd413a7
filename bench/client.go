package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// chatMessage is one OpenAI chat message.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type requestBody struct {
	Model         string         `json:"model"`
	Messages      []chatMessage  `json:"messages,omitempty"`
	Prompt        string         `json:"prompt,omitempty"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
	IgnoreEOS     bool           `json:"ignore_eos,omitempty"`
}

// Sample is the client's measurement of one request.
type Sample struct {
	TTFT, E2E    time.Duration
	PromptTokens int
	CachedTokens int
	Endpoint     string // X-Engine-Id of the engine that answered
	Text         string // generated text (the next chat turn includes it)
	Err          error
}

type streamChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// doStream sends one streaming request and measures it. TTFT is the time to the first
// chunk that carries generated text.
func doStream(ctx context.Context, hc *http.Client, url string, body []byte) Sample {
	var s Sample
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		s.Err = err
		return s
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		s.Err = err
		return s
	}
	defer resp.Body.Close()
	s.Endpoint = resp.Header.Get("X-Engine-Id")
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		s.Err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		return s
	}
	var text strings.Builder
	br := bufio.NewReaderSize(resp.Body, 16<<10)
	done := false
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			line = bytes.TrimSpace(line)
			if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
				data = bytes.TrimSpace(data)
				if string(data) == "[DONE]" {
					done = true
					break
				}
				var ch streamChunk
				if jerr := json.Unmarshal(data, &ch); jerr != nil {
					s.Err = fmt.Errorf("bad SSE chunk %.80q: %v", data, jerr)
					return s
				}
				for _, c := range ch.Choices {
					t := c.Text + c.Delta.Content
					if t != "" && s.TTFT == 0 {
						s.TTFT = time.Since(start)
					}
					text.WriteString(t)
				}
				if ch.Usage != nil {
					s.PromptTokens = ch.Usage.PromptTokens
					if ch.Usage.PromptTokensDetails != nil {
						s.CachedTokens = ch.Usage.PromptTokensDetails.CachedTokens
					}
				}
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				s.Err = err
				return s
			}
			break
		}
	}
	s.E2E = time.Since(start)
	s.Text = text.String()
	if !done {
		s.Err = errors.New("stream ended without [DONE]")
	} else if s.TTFT == 0 {
		s.Err = errors.New("stream carried no text")
	}
	return s
}

// newHTTPClient is a client with enough idle connections for the workload's concurrency.
func newHTTPClient() *http.Client {
	tr := &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: 30 * time.Second, DisableCompression: true}
	return &http.Client{Transport: tr}
}
