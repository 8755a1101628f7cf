// cudaapp is the real-node suite's stand-in for a CUDA program, in an
// image that is not NVIDIA's (its own binary and glibc, nothing else): it
// loads libcuda.so.1 as the CUDA runtime does, from wherever the dynamic
// linker finds it, calls cuInit and cuDriverGetVersion, prints one line
//
//	=== CUDA <path loaded> cuInit=<ret> version=<v> <stand-in's name>
//
// (or "=== CUDA dlopen failed: <why>") and sleeps until it is stopped.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) {
		printf("=== CUDA dlopen failed: %s\n", dlerror());
	} else {
		struct link_map *lm = NULL;
		dlinfo(h, RTLD_DI_LINKMAP, &lm);
		int (*cu_init)(unsigned int) = (int (*)(unsigned int))dlsym(h, "cuInit");
		int (*get_version)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
		const char *(*standin)(void) = (const char *(*)(void))dlsym(h, "hwdra_standin");
		int version = 0;
		int init = cu_init ? cu_init(0) : -1;
		if (get_version) {
			get_version(&version);
		}
		printf("=== CUDA %s cuInit=%d version=%d %s\n", lm ? lm->l_name : "?", init, version, standin ? standin() : "(not the stand-in)");
	}
	fflush(stdout);
	for (;;) {
		pause();
	}
}
