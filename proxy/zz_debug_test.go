package proxy

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/proxy/openai"
	"github.com/kvgate/kvgate/tokenize"
)

func TestZZFollow(t *testing.T) {
	body, at := followupBody()
	s, st := benchServerWith(t, body, func(*Config) {})
	var d decision
	turn := func(n int) {
		for k := 6; k >= 0; k-- {
			st.body[at+k] = byte('0' + n%10)
			n /= 10
		}
		openai.Scan(st.body, &st.oa)
		clear(st.excluded)
		s.decide(st, &d, false)
	}
	turn(0)
	for n := 1; n < 4; n++ {
		turn(n)
		fmt.Printf("%+v\n", s.kv.render.Stats())
	}
	_ = tokenize.RenderUse{}
}
