//go:build !amd64 || purego

package hashcore

// haveSHA256Blocks is false where kvgate has no SHA-256 block function of its own:
// the chains use crypto/sha256.
const haveSHA256Blocks = false

func sha256Blocks(h *[8]uint32, p []byte) {
	panic("hashcore: sha256Blocks called without a block function")
}
