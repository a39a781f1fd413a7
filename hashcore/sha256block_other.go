//go:build !amd64 || purego

package hashcore

// haveSHA256Blocks is false where kvgate has no SHA-256 block function of its own:
// the chains use crypto/sha256.
const haveSHA256Blocks = false

func sha256Blocks(h *[8]uint32, p []byte) {
	panic("hashcore: sha256Blocks called without a block function")
}

func sha256Digest(out *[32]byte, p []byte) {
	panic("hashcore: sha256Digest called without a block function")
}

func sha256ChainAt0(d *[32]byte, p []byte)  { sha256Blocks(nil, p) }
func sha256ChainAt3(d *[32]byte, p []byte)  { sha256Blocks(nil, p) }
func sha256ChainAt13(d *[32]byte, p []byte) { sha256Blocks(nil, p) }

// haveSHA256Fused is false where kvgate has no block function of its own.
const haveSHA256Fused = false

// haveSHA256FusedScalar is false where kvgate has no block function of its own.
const haveSHA256FusedScalar = false

func sha256ChainCBORAVX512(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int) {
	sha256Blocks(nil, nil)
}

func sha256ChainPickleAVX512(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int) {
	sha256Blocks(nil, nil)
}

func sha256ChainSGLangAVX512(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int) {
	sha256Blocks(nil, nil)
}

func sha256ChainCBORScalar(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int) {
	sha256Blocks(nil, nil)
}

func sha256ChainPickleScalar(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int) {
	sha256Blocks(nil, nil)
}

func sha256ChainSGLangScalar(d *[32]byte, plan *sha256FusedPlan, slots *byte, slotSize int, blocks0 int, tokens *uint32, keys *uint64, n int) {
	sha256Blocks(nil, nil)
}
