#!/bin/bash
set -u
ITEMS="machine build" DEADLINE_S=250 timeout 250 scripts/gpu-check.sh $OUT/c >/dev/null 2>&1
head -8 $OUT/c/report.md
cat > /tmp/segv.c <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>
#include <stdio.h>
#include <sys/syscall.h>
static void say(void*a){Dl_info i;if(dladdr(a,&i)&&i.dli_fname)fprintf(stderr,"  %p %s+%lx %s\n",a,i.dli_fname,(unsigned long)((char*)a-(char*)i.dli_fbase),i.dli_sname?i.dli_sname:"?");else fprintf(stderr,"  %p ?\n",a);}
static void h(int s,siginfo_t*si,void*c){ucontext_t*u=c;void*ip=(void*)u->uc_mcontext.gregs[REG_RIP];void**sp=(void**)u->uc_mcontext.gregs[REG_RSP];
fprintf(stderr,"SEGV tid %ld pid %d addr %p\nrip:\n",(long)syscall(SYS_gettid),getpid(),si->si_addr);say(ip);fprintf(stderr,"stack:\n");for(int k=0;k<40;k++)say(sp[k]);
char p[64];snprintf(p,64,"/proc/self/task/%ld/comm",(long)syscall(SYS_gettid));FILE*f=fopen(p,"r");if(f){char b[64];if(fgets(b,64,f))fprintf(stderr,"comm %s",b);}
signal(s,SIG_DFL);raise(s);}
__attribute__((constructor)) static void i(void){struct sigaction a={0};a.sa_sigaction=h;a.sa_flags=SA_SIGINFO;sigaction(SIGSEGV,&a,0);}
C
cc -shared -fPIC -o /tmp/segv.so /tmp/segv.c -ldl
cd build-gpu/tests
ldd ./checkpoint_test | grep -v "torch/lib\|nvidia" 
echo "== segv"
LD_PRELOAD=/tmp/segv.so ./checkpoint_test --gtest_filter='*Stored*' 2>&1 | grep -v " I trainyard" | grep -A60 SEGV
echo "== segv upload"
LD_PRELOAD=/tmp/segv.so ./checkpoint_test --gtest_filter='*Nice*' 2>&1 | grep -A60 SEGV
