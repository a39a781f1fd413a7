//go:build !amd64 || purego

package hashcore

// haveTokensAVX512 is false where kvgate has no vector token encoder: the encoders
// write one token at a time.
const haveTokensAVX512 = false

func cborTokensAVX512(dst *byte, tokens *uint32, steps int) int {
	panic("hashcore: cborTokensAVX512 called without AVX-512")
}

func pickleTokensAVX512(dst *byte, tokens *uint32, steps int) int {
	panic("hashcore: pickleTokensAVX512 called without AVX-512")
}
