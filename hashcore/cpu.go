package hashcore

import (
	"runtime"
	"strings"

	"github.com/klauspost/cpuid/v2"
)

// CPUFeatures lists the CPU features that speed up hashing and are present, e.g.
// "sha-ni avx2 avx512f" (amd64) or "sha2" (arm64); "none" when there are none.
func CPUFeatures() string {
	var f []string
	switch runtime.GOARCH {
	case "amd64", "386":
		if cpuid.CPU.Supports(cpuid.SHA) {
			f = append(f, "sha-ni")
		}
		if cpuid.CPU.Supports(cpuid.AVX2) {
			f = append(f, "avx2")
		}
		if cpuid.CPU.Supports(cpuid.AVX512F) {
			f = append(f, "avx512f")
		}
		if cpuid.CPU.Supports(cpuid.BMI2) {
			f = append(f, "bmi2")
		}
	case "arm64":
		if cpuid.CPU.Supports(cpuid.SHA2) {
			f = append(f, "sha2")
		}
		if cpuid.CPU.Supports(cpuid.ASIMD) {
			f = append(f, "neon")
		}
	}
	if len(f) == 0 {
		return "none"
	}
	return strings.Join(f, " ")
}

// SHA256Path names the SHA-256 path the chains use on this CPU and build, e.g.
// "sha-ni (kvgate, avx512 token encoding, fused loop)": kvgate's own SHA-NI block function, else
// the block function crypto/sha256 picks (following its own selection rule,
// crypto/internal/fips140/sha256, Go 1.26), e.g. "avx2 (crypto/sha256)"; and whether
// the block messages' tokens are encoded with AVX-512, and whether the chains run in
// a fused assembly loop that writes each message while hashing the previous one (the
// AVX-512 loop, else the scalar one).
func SHA256Path() string {
	var s string
	if haveSHA256Blocks {
		s = "sha-ni (kvgate"
	} else {
		s = stdlibSHA256Path() + " (crypto/sha256"
	}
	if haveTokensAVX512 {
		s += ", avx512 token encoding"
	}
	if haveSHA256Fused || haveSHA256FusedScalar {
		s += ", fused loop"
	}
	return s + ")"
}

func stdlibSHA256Path() string {
	switch runtime.GOARCH {
	case "amd64":
		if cpuid.CPU.Supports(cpuid.AVX, cpuid.SHA, cpuid.SSE4, cpuid.SSSE3) {
			return "sha-ni"
		}
		if cpuid.CPU.Supports(cpuid.AVX, cpuid.AVX2, cpuid.BMI2) {
			return "avx2"
		}
	case "arm64":
		if cpuid.CPU.Supports(cpuid.SHA2) {
			return "armv8-sha2"
		}
	}
	return "generic"
}

// XXH3Path names the kernel github.com/zeebo/xxh3 uses for inputs over 240 bytes.
func XXH3Path() string {
	switch runtime.GOARCH {
	case "amd64":
		if cpuid.CPU.Supports(cpuid.AVX512F) {
			return "avx512"
		}
		if cpuid.CPU.Supports(cpuid.AVX2) {
			return "avx2"
		}
		return "sse2"
	case "arm64":
		return "neon"
	}
	return "generic"
}
