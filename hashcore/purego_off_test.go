//go:build !purego

package hashcore

const puregoBuild = false
