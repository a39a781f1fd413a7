package proxy

import (
	"fmt"
	"os"
)

// What a running rule takes from a re-read -config (SIGHUP): its endpoints (through the
// fleet's one change path), the access log switch and the admin token. The command
// applies the log level itself and names every other changed flag in a WARN.

// SetAccessLog turns the per-request access log on or off.
func (s *Server) SetAccessLog(on bool) { s.accessLogOn.Store(on) }

// SetAdminToken replaces the admin listener's token ("" : no token wanted).
func (s *Server) SetAdminToken(token string) { s.setAdminToken(token) }

func (s *Server) setAdminToken(token string) {
	want := ""
	if token != "" {
		want = "Bearer " + token
	}
	s.adminAuth.Store(&want)
}

// ReloadEndpoints moves the fleet to a re-read rule's endpoints: static (its -endpoint
// flags, discover=dns templates included) and -endpoints-file read again, in one change.
// A rule that does not parse or validate is refused whole; the running fleet stays.
func (s *Server) ReloadEndpoints(static []EndpointSpec) error {
	ch := fleetChange{why: "SIGHUP", static: static, setStatic: true, resolve: true}
	path := s.cfg.Fleet.EndpointsFile
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("-endpoints-file: %w", err)
		}
		eps, lines, err := parseEndpointsFile(path, b)
		if err != nil {
			return err
		}
		ch.file, ch.setFile, ch.lines = eps, true, lines
		ch.sum = sha256Sum(b)
	}
	if err := s.fleet.change(ch); err != nil {
		if path != "" {
			return fmt.Errorf("%s: %w", fileLineOf(path, ch.lines, err), err)
		}
		return err
	}
	return nil
}
